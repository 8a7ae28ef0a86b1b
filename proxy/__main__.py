"""`vllm-sidecar` and `python -m proxy`: settings from the CLI and environment, then serve."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config.settings import load
from proxy.observe import logs
from proxy.pod import cpus


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(argv)
    settings = settings.model_copy(update={"workers": cpus.worker_count(settings.workers)})
    shared = settings.workers > 1
    logs.setup(
        settings.log_level, settings.log_format, access_log=settings.access_log, shared=shared
    )
    # Imported only now: with several workers, prometheus_client must first see its
    # multiprocess directory (see `pod.launch`).
    if settings.workers == 1:
        from proxy.wiring import server

        server.run(settings)
    else:
        from proxy.pod import launch

        launch.run(settings)


if __name__ == "__main__":
    main()

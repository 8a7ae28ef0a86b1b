"""`vllm-sidecar` and `python -m proxy`: settings from the CLI and environment, then serve."""

from __future__ import annotations

from collections.abc import Sequence

from . import logs, server
from .settings import load


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(argv)
    logs.setup(settings.log_level, settings.log_format, access_log=settings.access_log)
    server.run(settings)


if __name__ == "__main__":
    main()

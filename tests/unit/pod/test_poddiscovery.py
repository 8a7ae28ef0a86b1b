"""A worker's discovery taking the supervisor's published states (`proxy/pod/poddiscovery.py`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.config.settings import Settings
from proxy.core.resolution import ServedModel
from proxy.observe.metrics import Metrics
from proxy.pod.messages import DiscoveryState
from proxy.pod.poddiscovery import follow
from proxy.upstream.checks import UpstreamChecks
from proxy.upstream.discovery import Discovery


def state(served: list[list[str | None]], *, healthy: bool = True) -> DiscoveryState:
    error = None if healthy else "/health answered 503"
    models = tuple(ServedModel(str(name), root) for name, root in served)
    return DiscoveryState(models, models_known=True, healthy=healthy, last_error=error)


def worker() -> Discovery:
    settings = Settings()
    # its source never runs: the test hands it the supervisor's states
    metrics = Metrics(CollectorRegistry())
    return Discovery(settings, metrics, URL(settings.upstream_url), source=UpstreamChecks)


def test_a_health_flip_keeps_the_table_and_a_new_name_makes_one() -> None:
    discovery = worker()
    adapters: list[list[str | None]] = [[f"a-{i}", f"/adapters/a-{i}"] for i in range(3)]
    follow(discovery, state(adapters))
    table = discovery.table
    follow(discovery, state(adapters, healthy=False))  # the same names, sent again
    assert discovery.table is table  # 50,001 adapters took a second to index again
    assert (discovery.healthy, discovery.last_error) == (False, "/health answered 503")
    follow(discovery, state([*adapters, ["a-3", "/adapters/a-3"]]))
    assert discovery.table is not table
    assert discovery.table.resolve("a-3").served == "a-3"
    assert discovery.healthy
    follow(discovery, state([["a-3", None]]))  # the root changed: another table
    assert discovery.table.served[0].root is None

"""The counters against the ledger: what the sidecar counted, request by request.

Where a ledger entry cannot know what the sidecar counted (a worker killed while the request was
in flight, a hang-up racing a vLLM restart), the entry is *ambiguous*: it may be counted or not,
and the counters are checked to lie between the certain count and the certain count plus the
ambiguous ones; every other entry is counted exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tests.metrics import Samples

from .checks import Check, Span, error_of, route
from .ledger import HUNG_UP, LOST, Entry

Label = tuple[str, ...]
# Seconds after its end at the client a request's count may still be on its way in its worker:
# a hang-up's 499 is counted once the worker notices; an answer just after its last byte.
PAD_HUNG_UP, PAD_ANSWERED = 2.0, 0.5


def near(e: Entry, spans: list[Span]) -> bool:
    """Whether the request, or its count on the way after it, overlapped one of `spans`."""
    pad = PAD_HUNG_UP if e.outcome == HUNG_UP else PAD_ANSWERED
    return any(e.sent <= end and begin <= e.ended + pad for begin, end in spans)


def expected_counts(
    entries: Iterable[Entry], kills: list[Span], restarts: list[Span]
) -> tuple[Counter[Label], Counter[Label], Counter[Label], Counter[str]]:
    """From the ledger: certain request counts by (route, method, status), certain failure
    counts by (route, source, reason, status), ambiguous requests by route (any label of it),
    and certain client disconnects by route."""
    requests: Counter[Label] = Counter()
    failures: Counter[Label] = Counter()
    maybe: Counter[Label] = Counter()
    gone: Counter[str] = Counter()
    for e in entries:
        hung = e.outcome == HUNG_UP
        if e.outcome == LOST or near(e, kills) or (hung and near(e, restarts)):
            maybe[(route(e),)] += 1
            continue
        # A hang-up mid-stream is counted with the 200 it had; one before any answer as 499.
        status = e.status if e.status is not None else 499
        requests[(route(e), e.method, str(status))] += 1
        if hung:
            gone[route(e)] += 1
        elif (err := error_of(e)) is not None and "reason" in err:
            failures[(route(e), err["source"], err["reason"], str(err["code"]))] += 1
        elif err is not None:  # vLLM's own in-stream error event, relayed
            failures[(route(e), "upstream", "upstream_stream_error", str(err["code"]))] += 1
    return requests, failures, maybe, gone


def counters_match(
    entries: list[Entry], samples: Samples, kills: list[Span], restarts: list[Span]
) -> Check:
    requests, failures, maybe, gone = expected_counts(entries, kills, restarts)
    ambiguous = sum(maybe.values())
    detail = f"{sum(requests.values())} requests counted exactly, {ambiguous} ambiguous"
    check = Check("the sidecar's counters equal the ledger's", detail=detail)
    _compare(
        check,
        "vllm_sidecar_requests_total",
        ("route", "method", "status"),
        requests,
        samples,
        maybe,
    )
    _compare(
        check,
        "vllm_sidecar_failures_total",
        ("route", "source", "reason", "status"),
        failures,
        samples,
        maybe,
    )
    disconnects = Counter({(r,): n for r, n in gone.items()})
    _compare(
        check, "vllm_sidecar_client_disconnects_total", ("route",), disconnects, samples, maybe
    )
    return check


def _compare(
    check: Check,
    name: str,
    keys: tuple[str, ...],
    want: Counter[Label],
    samples: Samples,
    maybe: Counter[Label],
) -> None:
    """certain <= counted <= certain + ambiguous, per label set; exact where none is ambiguous.
    The ambiguous requests of a route are shared by its label sets: the excess over all of
    them together is bounded too."""
    got: Counter[Label] = Counter()
    for (sample, labels), value in samples.values.items():
        if sample == name:
            ls = dict(labels)
            got[tuple(ls[k] for k in keys)] += int(value)
    excess: Counter[str] = Counter()
    for label in set(got) | set(want):
        slack = maybe[(label[0],)]
        if not want[label] <= got[label] <= want[label] + slack:
            check.problems.append(
                f"{name}{label}: ledger {want[label]} (+{slack} ambiguous), sidecar {got[label]}"
            )
        excess[label[0]] += got[label] - want[label]
    for r, extra in excess.items():
        if extra > maybe[(r,)]:
            check.problems.append(
                f"{name} {r}: {extra} more than the ledger's, {maybe[(r,)]} ambiguous"
            )


def settled(samples: Samples, kills: int) -> Check:
    check = Check("the pod settles: nothing in flight or held, every killed worker replaced")
    wanted = {
        "vllm_sidecar_in_flight_requests": 0,
        "vllm_sidecar_held_requests": 0,
        "vllm_sidecar_worker_restarts_total": kills,
        "vllm_sidecar_workers": 2,
    }
    for name, value in wanted.items():
        got = sum(v for (n, _), v in samples.values.items() if n == name)
        if got != value:
            check.problems.append(f"{name}: {got}, expected {value}")
    return check

"""The checks over a chaos run's ledger, the fake vLLM's own record and the sidecar's metrics.

Each check returns its problems, one line per request (seq and request id first), so a failure
names the ledger lines to look at. The counters' checks are in counts.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .ledger import ANSWERED, HUNG_UP, LOST, Entry
from .upstream import Sent

ENVELOPE_KEYS = {"message", "type", "param", "code", "source", "reason", "retryable", "request_id"}
# What chaos may fairly produce; `internal_error` (the sidecar's bare 500) never.
REASONS = {
    "upstream_status",
    "upstream_disconnected",
    "upstream_unreachable",
    "upstream_invalid_response",
    "upstream_stream_error",
}
Span = tuple[float, float]  # seconds into the run: a kill (signal to reaped), vLLM down


@dataclass
class Check:
    name: str
    problems: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def passed(self) -> bool:
        return not self.problems


def _id(e: Entry) -> str:
    return f"#{e.seq} {e.rid} {e.kind} {e.path}"


def route(e: Entry) -> str:
    return e.path.split("?")[0]


def error_of(e: Entry) -> dict[str, Any] | None:
    """The envelope (or vLLM's error) a failed request or stream ended with."""
    if isinstance(e.body, dict) and isinstance(e.body.get("error"), dict):
        return e.body["error"]
    errors = [ev["error"] for ev in e.events if isinstance(ev, dict) and "error" in ev]
    return errors[-1] if errors else None


def chunks(e: Entry) -> list[dict[str, Any]]:
    return [ev for ev in e.events if isinstance(ev, dict) and "choices" in ev]


def is_sse(e: Entry) -> bool:
    return e.outcome == ANSWERED and e.headers.get("Content-Type", "").startswith(
        "text/event-stream"
    )


def own_answers(entries: Iterable[Entry], sent: dict[str, Sent]) -> Check:
    """Every answer is its own request's: its request id, its nonce, its error body."""
    check = Check("each answer belongs to its own request")
    for e in entries:
        if e.outcome != ANSWERED:
            continue
        if e.headers.get("X-Request-Id") != e.rid:
            check.problems.append(f"{_id(e)}: X-Request-Id {e.headers.get('X-Request-Id')}")
        answers = chunks(e) if is_sse(e) else [e.body] if isinstance(e.body, dict) else []
        for answer in answers:
            if "choices" not in answer:
                continue
            texts = {c["text"] for c in answer["choices"]} - {""}
            if answer["id"] != f"cmpl-{e.rid}" or texts - {f" {e.nonce}"}:
                check.problems.append(f"{_id(e)}: got {answer['id']} {sorted(texts)}")
        err = error_of(e)
        if err is not None and "request_id" in err and err["request_id"] != e.rid:
            check.problems.append(f"{_id(e)}: envelope of {err['request_id']}")
        if err is not None and err.get("reason") == "upstream_status":
            mine = sent.get(e.rid)
            got = (err.get("upstream") or {}).get("body")
            if mine is None or got != mine.body:
                check.problems.append(f"{_id(e)}: upstream body {got!r} is not the one vLLM sent")
        relayed = err is not None and err.get("reason") == "upstream_status"
        if e.kind == "bad" and relayed and f"got {e.tokens}." not in err["message"]:
            check.problems.append(f"{_id(e)}: vLLM's 400 for max_tokens={e.tokens} not relayed")
    return check


def failures_are_envelopes(entries: Iterable[Entry]) -> Check:
    """Every non-2xx is the envelope, with its reason in the header; no bare 500, no HTML."""
    check = Check("every failure is an envelope or an SSE error event")
    for e in entries:
        if e.outcome != ANSWERED or e.status is None:
            continue
        if e.status < 400:
            if not is_sse(e) and not isinstance(e.body, dict):
                check.problems.append(f"{_id(e)}: {e.status} with a body that is not JSON")
            continue
        err = e.body.get("error") if isinstance(e.body, dict) else None
        if not isinstance(err, dict) or not ENVELOPE_KEYS <= set(err):
            check.problems.append(f"{_id(e)}: {e.status} is not an envelope: {str(e.body)[:200]}")
            continue
        if err["code"] != e.status or e.headers.get("X-Sidecar-Error") != err["reason"]:
            check.problems.append(f"{_id(e)}: code {err['code']}, header {e.headers}")
        if err["reason"] not in REASONS:
            check.problems.append(f"{_id(e)}: reason {err['reason']}: {err['message'][:200]}")
    return check


def streams_end_properly(entries: Iterable[Entry]) -> Check:
    """A stream ends with [DONE] after whole events (all the tokens asked, unless vLLM aborted
    it), or with one error event and [DONE]; a JSON answer is whole. Nothing silently short."""
    check = Check("no silent truncation: streams end with [DONE] or an error event")
    for e in entries:
        if e.outcome != ANSWERED or e.status != 200:
            continue
        if not is_sse(e):
            if e.method == "POST" and e.kind != "control":
                _whole_json(e, check)
            continue
        events = list(e.events)
        while events and isinstance(events[-1], dict) and "named" in events[-1]:
            events.pop()  # `event: weight_version` comes after vLLM's [DONE] (lifecycle.md)
        bad = [ev for ev in events if isinstance(ev, str) and ev.startswith("!")]
        if e.body is not None or bad or events.count("[DONE]") != 1 or events[-1:] != ["[DONE]"]:
            check.problems.append(f"{_id(e)}: stream ends {events[-2:]} {bad[:1]} {e.body!r}")
            continue
        if error_of(e) is not None:
            if not (isinstance(events[-2], dict) and "error" in events[-2]):
                check.problems.append(f"{_id(e)}: events after the error event")
            continue
        finishes = [c["finish"] for ev in chunks(e) for c in ev["choices"] if c["finish"]]
        texts = [c for ev in chunks(e) for c in ev["choices"] if c["text"]]
        whole = finishes == ["length"] and len(texts) == e.tokens
        if not (whole or finishes == ["abort"]):
            check.problems.append(f"{_id(e)}: {len(texts)} of {e.tokens} tokens, ends {finishes}")
    return check


def _whole_json(e: Entry, check: Check) -> None:
    body = e.body
    if not isinstance(body, dict) or len(body.get("choices", [])) != 1:
        check.problems.append(f"{_id(e)}: 200 JSON is not one completion: {str(body)[:200]}")
    elif body["choices"][0]["finish"] not in ("length", "abort"):
        check.problems.append(f"{_id(e)}: finish {body['choices'][0]['finish']}")


def ran_what_was_answered(
    entries: Iterable[Entry], sent: dict[str, Sent], dupes: list[str]
) -> Check:
    """A 200 only for a generation vLLM ran to that end; a `not sent` only for one it never
    saw; a hang-up's generation cancelled; no request sent twice."""
    check = Check("nothing vLLM did not run is reported as run")
    check.problems += [f"{rid}: reached vLLM twice" for rid in dupes]
    for e in entries:
        mine = sent.get(e.rid)
        if e.kind == "control":
            continue
        state = mine.state if mine else None
        if e.outcome == ANSWERED and e.status == 200 and error_of(e) is None:
            answers = chunks(e) if is_sse(e) else [e.body]
            finish = [c["finish"] for a in answers for c in a["choices"] if c["finish"]]
            want = "aborted" if finish == ["abort"] else "done"
            if state != want:
                check.problems.append(f"{_id(e)}: answered {finish}, vLLM's record: {state}")
        err = error_of(e)
        if err is not None and err.get("reason") == "upstream_unreachable" and mine is not None:
            check.problems.append(f"{_id(e)}: 'not sent', yet vLLM got it ({state})")
        if e.kind == "hangup_body" and mine is not None:
            check.problems.append(f"{_id(e)}: half a body reached vLLM whole ({state})")
        if e.kind in ("hangup_wait", "hangup_stream") and e.outcome == HUNG_UP and mine:
            if state not in ("cancelled",):
                check.problems.append(f"{_id(e)}: the client left, vLLM's generation {state}")
    return check


def lost_only_to_kills(entries: Iterable[Entry], kills: list[Span]) -> Check:
    """A request may be lost without an answer only with the worker that held it: one killed
    (from its SIGKILL until it was gone) while the request was in flight."""
    check = Check("a request is lost only with a killed worker")
    for e in entries:
        if e.outcome == LOST and not any(
            e.sent <= end and begin <= e.ended for begin, end in kills
        ):
            check.problems.append(f"{_id(e)}: lost ({e.error}) with no worker killed meanwhile")
    return check

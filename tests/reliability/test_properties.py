"""Properties of model resolution and of the envelope, over generated tables, names and bodies."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import envelope, errors, upstream_body
from proxy.core.body import find_model, replace_model
from proxy.core.resolution import AMBIGUOUS, CASE, EXACT, RULES, UNRESOLVED, ModelTable, ServedModel
from tests import strategies

# Names shaped like the real ones: HF paths, basenames, local paths; small alphabets make
# collisions (ambiguity, case clashes) common enough to matter.
_part = st.text(alphabet="abAB-._0", min_size=1, max_size=4)
_names = st.one_of(
    _part,
    st.builds(lambda o, n: f"{o}/{n}", _part, _part),
    st.builds(lambda *p: "/" + "/".join(p), _part, _part, _part),
)
_served = st.lists(
    st.builds(ServedModel, _names, st.none() | _names), max_size=5, unique_by=lambda m: m.id
)


@st.composite
def tables(draw: st.DrawFn, *, served_targets: bool = True) -> tuple[ModelTable, list[Any]]:
    served = draw(_served)
    ids = [m.id for m in served]
    target = st.sampled_from(ids) if served_targets and ids else _names
    aliases = draw(st.dictionaries(_names, target, max_size=3)) if ids or not served_targets else {}
    case = draw(st.booleans())
    return ModelTable(served, aliases, case_insensitive=case), [served, aliases, case]


def requested(table: ModelTable) -> st.SearchStrategy[str]:
    known = [m.id for m in table.served] + [m.root for m in table.served if m.root]
    known += list(table.aliases)
    variants = (
        st.sampled_from(known).flatmap(
            lambda n: st.sampled_from(
                [n, n.upper(), n.lower(), "org/" + n.rsplit("/", 1)[-1], "/ckpt/" + n + "/"]
            )
        )
        if known
        else _names
    )
    return st.one_of(variants, _names, st.text(max_size=20))


@given(st.data())
def test_resolution_is_deterministic(data: st.DataObject) -> None:
    table, (served, aliases, case) = data.draw(tables())
    name = data.draw(requested(table))
    again = ModelTable(list(served), dict(aliases), case_insensitive=case)
    assert table.resolve(name) == table.resolve(name) == again.resolve(name)


@given(st.data())
def test_resolution_only_ever_names_a_served_model(data: st.DataObject) -> None:
    table, _ = data.draw(tables())
    res = table.resolve(data.draw(requested(table)))
    assert res.rule in RULES
    if res.rule in (UNRESOLVED, AMBIGUOUS):
        assert res.served is None
    else:
        assert res.served in table.names
    if res.rule == AMBIGUOUS:
        assert len(res.candidates) >= 2
        assert set(res.candidates) <= set(table.names)
    if not table.case_insensitive:
        assert res.rule != CASE


@given(st.data())
def test_an_alias_to_an_unserved_name_is_the_only_way_out_of_the_served_list(
    data: st.DataObject,
) -> None:
    # A configured alias is taken at its word even when its target is not served (yet):
    # the request is forwarded there and the upstream's 404 comes back enveloped.
    table, _ = data.draw(tables(served_targets=False))
    res = table.resolve(data.draw(requested(table)))
    assert res.served is None or res.served in {*table.names, *table.aliases.values()}


@given(_served, st.booleans())
def test_every_served_name_resolves_to_itself(served: list[ServedModel], case: bool) -> None:
    table = ModelTable(served, case_insensitive=case)
    for name in table.names:
        res = table.resolve(name)
        assert (res.served, res.rule, res.changed) == (name, EXACT, False)


json_values = strategies.json_values(size=3, leaves=10)


@given(
    st.data(),
    st.dictionaries(st.text().filter(lambda k: k != "model"), json_values, max_size=4),
    st.sampled_from([(", ", ": "), (",", ":"), (" ,\n", " :\t")]),
)
def test_forwarded_body_differs_from_the_sent_one_only_in_a_served_model(
    data: st.DataObject, rest: dict[str, Any], separators: tuple[str, str]
) -> None:
    """What inbound.resolve_model does, end to end: find, resolve, replace."""
    table, _ = data.draw(tables())
    name = data.draw(requested(table))
    body = json.dumps({**rest, "model": name}, separators=separators).encode()
    field = find_model(body)
    assert field is not None
    res = table.resolve(name)
    out = replace_model(body, field, res.served) if res.changed and res.served else body
    assert json.loads(out) == {**rest, "model": res.served if res.changed else name}
    assert out[: field.start] == body[: field.start]
    assert out[len(out) - (len(body) - field.end) :] == body[field.end :]


# -- the envelope ---------------------------------------------------------------------------
REQUIRED = {"message", "type", "param", "code", "source", "reason", "retryable", "request_id"}
FAILURES = [
    errors.UpstreamUnreachable,
    errors.UpstreamTimeout,
    errors.UpstreamDisconnected,
    errors.UpstreamInvalidResponse,
    errors.ModelAmbiguous,
    errors.InvalidJSON,
    errors.InvalidRequest,
    errors.BodyTooLarge,
    errors.ShuttingDown,
]
_models = st.none() | st.builds(
    envelope.ModelInfo,
    st.text(),
    st.none() | st.text(),
    st.lists(st.text(), max_size=3).map(tuple),
    st.lists(st.text(), max_size=3).map(tuple),
)


def check(env: dict[str, Any], status: int) -> dict[str, Any]:
    raw = envelope.encode(env)
    parsed = orjson.loads(raw)
    assert parsed == json.loads(raw)  # plain JSON, readable by any parser
    err = parsed["error"]
    assert set(parsed) == {"error"}
    assert REQUIRED <= set(err)
    assert isinstance(err["message"], str)
    assert err["message"].strip()
    assert isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] == status
    assert err["source"] in ("sidecar", "upstream")
    assert isinstance(err["retryable"], bool)
    sse = envelope.sse_event(env)
    assert sse.endswith(b"\n\ndata: [DONE]\n\n")
    assert orjson.loads(sse.split(b"\n\n")[0].removeprefix(b"data: ")) == parsed
    return err  # type: ignore[no-any-return]


@given(
    st.sampled_from(FAILURES),
    st.text(min_size=1).filter(str.strip),
    st.text(max_size=40),
    _models,
)
def test_every_failure_envelope_is_valid(
    kind: type[errors.SidecarFailure], message: str, rid: str, model: envelope.ModelInfo | None
) -> None:
    err = check(envelope.from_failure(kind(message), request_id=rid, model=model), kind.status)
    assert (err["reason"], err["source"]) == (kind.reason, "sidecar")


@given(
    status=st.integers(400, 599),
    method=st.sampled_from(["GET", "POST", "DELETE"]),
    path=st.text(max_size=30),
    # Header values arrive decoded with surrogateescape: lone surrogates are possible.
    content_type=st.none()
    | st.sampled_from(["application/json", "text/html", "text/plain"])
    | st.text(st.sampled_from(["a", "/", ";", "\u00e9", "\udcff", "\udcfe"]), max_size=10),
    encoding=st.none() | st.sampled_from(["gzip", "deflate", "br", "identity"]),
    raw=st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(
            lambda m, t, c: json.dumps({"error": {"message": m, "type": t, "code": c}}).encode(),
            st.text(),
            st.text() | st.integers(),
            st.integers() | st.none(),
        ),
    ),
    truncated=st.booleans(),
    model=_models,
)
def test_every_upstream_envelope_is_valid(
    status: int,
    method: str,
    path: str,
    content_type: str | None,
    encoding: str | None,
    raw: bytes,
    truncated: bool,
    model: envelope.ModelInfo | None,
) -> None:
    body = upstream_body.decode_body(
        raw, content_type=content_type, content_encoding=encoding, truncated=truncated
    )
    reply = envelope.UpstreamReply(status, method, path, content_type, body, truncated)
    err = check(envelope.from_upstream_status(reply, request_id="r", model=model), status)
    assert (err["reason"], err["source"]) == ("upstream_status", "upstream")
    assert err["upstream"]["status"] == status

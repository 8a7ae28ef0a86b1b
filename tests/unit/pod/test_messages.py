"""The pod's messages and their codec (`proxy/pod/messages.py`): every message's line on the wire,
a round trip of any message, and a line that is no message refused with a clear error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.settings import Settings, load
from proxy.core.phase import PAUSED, Engine
from proxy.core.resolution import ServedModel
from proxy.engine.history import Update
from proxy.engine.state import Snapshot
from proxy.pod.messages import (
    MESSAGES,
    Answered,
    DiscoveryChanged,
    DiscoveryState,
    Drain,
    Drained,
    EngineChanged,
    Enter,
    Entered,
    Failed,
    Frame,
    Hello,
    Leave,
    Listening,
    Message,
    MessageError,
    RefreshModels,
    StepTaken,
    decode,
    encode,
)

DISCOVERY = DiscoveryState((ServedModel("tiny", "/models/tiny"),), True, False, "/health: 503")
DISCOVERY_JSON = {
    "served": [{"id": "tiny", "root": "/models/tiny"}],
    "models_known": True,
    "healthy": False,
    "last_error": "/health: 503",
}
SNAPSHOT = Snapshot(
    Engine(PAUSED, syncing=True),
    version="v2",
    down=None,
    history=(Update(0, "default", 1.5, "vllm"), Update(1, "v2", 2.5, "trainer")),
)
SNAPSHOT_JSON = {
    "engine": {"base": "paused", "syncing": True},
    "version": "v2",
    "down": None,
    "history": [
        {"index": 0, "version": "default", "at": 1.5, "by": "vllm"},
        {"index": 1, "version": "v2", "at": 2.5, "by": "trainer"},
    ],
}
SETTINGS = Settings.model_validate({"control_token": "s3cret", "port": 9000})

# Each message as the other process reads it: the line is the contract between the two.
WIRE: list[tuple[Message, dict[str, Any]]] = [
    (
        Hello(SETTINGS, DISCOVERY, SNAPSHOT),
        {"settings": SETTINGS.for_worker(), "discovery": DISCOVERY_JSON, "engine": SNAPSHOT_JSON},
    ),
    (DiscoveryChanged(DISCOVERY), {"state": DISCOVERY_JSON}),
    (EngineChanged(SNAPSHOT), {"state": SNAPSHOT_JSON}),
    (Drain(), {}),
    (Entered(7), {"call": 7}),
    (StepTaken(), {}),
    (Listening(4242), {"pid": 4242}),
    (RefreshModels(), {}),
    (Enter("/pause"), {"path": "/pause"}),
    (Answered(7, "/pause", "mode=keep"), {"call": 7, "path": "/pause", "query": "mode=keep"}),
    (Failed(7, "/pause"), {"call": 7, "path": "/pause"}),
    (Leave(7), {"call": 7}),
    (Drained(3), {"in_flight": 3}),
]
TAGS = {
    Hello: "hello",
    DiscoveryChanged: "discovery",
    EngineChanged: "engine",
    Drain: "drain",
    Entered: "entered",
    StepTaken: "step_taken",
    Listening: "listening",
    RefreshModels: "refresh_models",
    Enter: "enter",
    Answered: "answered",
    Failed: "failed",
    Leave: "leave",
    Drained: "drained",
}


def test_the_table_covers_every_message() -> None:
    assert {type(message) for message, _ in WIRE} == set(MESSAGES) == set(TAGS)


@pytest.mark.parametrize(("message", "fields"), WIRE, ids=lambda v: type(v).__name__)
def test_each_message_is_one_line_tagged_with_its_type(
    message: Message, fields: dict[str, Any]
) -> None:
    line = encode(Frame(message, ask=2))
    assert line.endswith(b"\n")
    assert b"\n" not in line[:-1]
    assert orjson.loads(line) == {
        "message": {"type": TAGS[type(message)], **fields},
        "ask": 2,
        "reply": 0,
    }
    assert decode(line) == Frame(message, ask=2)


def test_a_worker_gets_the_token_itself_and_no_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    settings = load(["--control-token-file", str(token_file)])
    hello = decode(encode(Frame(Hello(settings, DISCOVERY, SNAPSHOT)))).message
    assert isinstance(hello, Hello)
    assert hello.settings.control_token is not None
    assert hello.settings.control_token.get_secret_value() == "from-a-file"
    assert hello.settings.control_token_file is None  # read once, by the supervisor


# -- any message, any frame -----------------------------------------------------------------------
names = st.text(max_size=20)
calls = st.integers(min_value=0, max_value=2**63 - 1)
served = st.builds(ServedModel, names, st.none() | names)
discovery = st.builds(DiscoveryState, st.lists(served, max_size=5).map(tuple))
snapshots = st.builds(
    Snapshot, st.builds(Engine, names, st.booleans()), st.none() | names, st.none() | names
)
settings = st.fixed_dictionaries(
    {
        "port": st.integers(1, 65535),
        "control_token": st.none() | st.text(min_size=1, max_size=20).filter(str.strip),
        "served_model_names": st.none() | st.lists(st.text("ab-", min_size=1), min_size=1),
    }
).map(Settings.model_validate)
STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    Hello: st.builds(Hello, settings, discovery, snapshots),
    DiscoveryChanged: st.builds(DiscoveryChanged, discovery),
    EngineChanged: st.builds(EngineChanged, snapshots),
    Drain: st.just(Drain()),
    Entered: st.builds(Entered, calls),
    StepTaken: st.just(StepTaken()),
    Listening: st.builds(Listening, calls),
    RefreshModels: st.just(RefreshModels()),
    Enter: st.builds(Enter, names),
    Answered: st.builds(Answered, calls, names, names),
    Failed: st.builds(Failed, calls, names),
    Leave: st.builds(Leave, calls),
    Drained: st.builds(Drained, calls),
}
messages = st.one_of(*STRATEGIES.values())


def test_every_message_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(MESSAGES)


@given(st.builds(Frame, messages, calls, calls))
def test_any_frame_comes_back_as_it_was_sent(frame: Frame) -> None:
    back = decode(encode(frame))
    assert type(back.message) is type(frame.message)
    assert back == frame


# -- lines that are no message ------------------------------------------------------------------
def line(message: object, **frame: object) -> bytes:
    return orjson.dumps({"message": message, "ask": 0, "reply": 0, **frame})


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b"", "the line: Invalid JSON"),
        (b"{not json\n", "the line: Invalid JSON"),
        (b"[1, 2]\n", "the line: Input should be an object"),
        (orjson.dumps({"ask": 1}), "message: Field required"),
        (line({"call": 3}), "message: Unable to extract tag using discriminator 'type'"),
        (line({"type": "miss"}), "message: Input tag 'miss' found using 'type' does not match"),
        (line({"type": "leave"}), "message.leave.call: Field required"),
        (line({"type": "leave", "call": "3"}), "message.leave.call: Input should be a valid int"),
        (line({"type": "leave", "call": True}), "message.leave.call: Input should be a valid int"),
        (line({"type": "enter", "path": 1}), "message.enter.path: Input should be a valid string"),
        (line({"type": "drain"}, ask="1"), "ask: Input should be a valid integer"),
        (line({"type": "drained"}), "message.drained.in_flight: Field required"),
    ],
)
def test_a_line_that_is_no_message_is_refused_by_name(raw: bytes, fault: str) -> None:
    with pytest.raises(MessageError, match="^" + re.escape(fault)):
        decode(raw)


def test_a_refused_hello_does_not_repeat_the_token() -> None:
    hello = orjson.loads(encode(Frame(Hello(SETTINGS, DISCOVERY, SNAPSHOT))))
    hello["message"]["settings"]["port"] = "not a port"
    with pytest.raises(MessageError) as refused:
        decode(orjson.dumps(hello))
    assert "message.hello.settings" in str(refused.value)
    assert "port" in str(refused.value)
    assert "s3cret" not in str(refused.value)

"""Every message between the supervisor and its workers, and their one codec (a line of JSON).

Each message is a class, named on the wire by its `type` tag; a `Frame` carries one, with the
number of the ask it makes or answers. Both ends are the same version of this module (the
supervisor starts its workers from its own package), so the format needs no version of its own;
a line that is not a frame of this module is a `MessageError`, dropped where it is received.
The table of messages, their direction and when each is sent: docs/workers.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, PlainSerializer, PlainValidator, TypeAdapter, ValidationError

from proxy.config.settings import Settings
from proxy.core.resolution import ServedModel
from proxy.engine.state import Call, Snapshot


class MessageError(ValueError):
    """A line that is no frame of this pod: not JSON, an unknown `type`, a field missing or of
    the wrong type. It names the first fault, never the line's values (a `Hello` holds the
    control token)."""


def _first_fault(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the line"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _read_settings(value: Any) -> Settings:
    try:
        return Settings.model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"invalid settings: {_first_fault(exc)}") from None


# A worker's settings go as `Settings.for_worker()` (the token in clear, no token file) and are
# validated as the CLI's are.
WorkerSettings = Annotated[
    Settings, PlainValidator(_read_settings), PlainSerializer(Settings.for_worker)
]


@dataclass(frozen=True, slots=True)
class DiscoveryState:
    """What a worker needs to resolve names and report readiness exactly as the supervisor."""

    served: tuple[ServedModel, ...]
    models_known: bool
    healthy: bool
    last_error: str | None


# -- the supervisor's -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """The first message to a worker: its settings and the pod's state as it starts."""

    type: Literal["hello"] = field(default="hello", init=False, repr=False)
    settings: WorkerSettings
    discovery: DiscoveryState
    engine: Snapshot


@dataclass(frozen=True, slots=True)
class DiscoveryChanged:
    """The pod's discovery changed; also the answer to `RefreshModels`."""

    type: Literal["discovery"] = field(default="discovery", init=False, repr=False)
    state: DiscoveryState


@dataclass(frozen=True, slots=True)
class EngineChanged:
    """The pod's engine phase, weight version or "vLLM is down" changed."""

    type: Literal["engine"] = field(default="engine", init=False, repr=False)
    state: Snapshot


@dataclass(frozen=True, slots=True)
class Drain:
    """The admin port's `POST /drain`: an ask; the answer is `Drained`."""

    type: Literal["drain"] = field(default="drain", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Entered:
    """The answer to `Enter`: the pod entered the call's phase, and numbered the call."""

    type: Literal["entered"] = field(default="entered", init=False, repr=False)
    call: Call


@dataclass(frozen=True, slots=True)
class StepTaken:
    """The answer to `Answered` and `Failed`: the pod took the step and told every worker."""

    type: Literal["step_taken"] = field(default="step_taken", init=False, repr=False)


# -- a worker's -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Listening:
    """The worker listens on the proxy port."""

    type: Literal["listening"] = field(default="listening", init=False, repr=False)
    pid: int


@dataclass(frozen=True, slots=True)
class RefreshModels:
    """The worker met an unknown model name: an ask to re-read the list (`DiscoveryChanged`)."""

    type: Literal["refresh_models"] = field(default="refresh_models", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Enter:
    """A phase-changing control call is about to be forwarded: an ask (`Entered`)."""

    type: Literal["enter"] = field(default="enter", init=False, repr=False)
    path: str


@dataclass(frozen=True, slots=True)
class Answered:
    """vLLM answered the call: the pod takes its phase (an ask, `StepTaken`)."""

    type: Literal["answered"] = field(default="answered", init=False, repr=False)
    call: Call
    path: str
    query: str


@dataclass(frozen=True, slots=True)
class Failed:
    """vLLM refused the call, or it never reached vLLM: back to the phase before it."""

    type: Literal["failed"] = field(default="failed", init=False, repr=False)
    call: Call
    path: str


@dataclass(frozen=True, slots=True)
class Leave:
    """The call's caller left: its phase stands (never asked)."""

    type: Literal["leave"] = field(default="leave", init=False, repr=False)
    call: Call


@dataclass(frozen=True, slots=True)
class Drained:
    """The answer to `Drain`: the requests still in flight when the worker's grace ended."""

    type: Literal["drained"] = field(default="drained", init=False, repr=False)
    in_flight: int


ToWorker = Hello | DiscoveryChanged | EngineChanged | Drain | Entered | StepTaken
ToSupervisor = Listening | RefreshModels | Enter | Answered | Failed | Leave | Drained
Step = Enter | Answered | Failed | Leave  # the steps of a control call a worker relays
Message = ToWorker | ToSupervisor
MESSAGES: tuple[type[Message], ...] = get_args(Message)


@dataclass(frozen=True, slots=True)
class Frame:
    """One line on a channel: a message, and the number of the ask it makes or answers."""

    message: Annotated[Message, Field(discriminator="type")]
    ask: int = 0  # not 0: the sender waits for the frame whose `reply` is this number
    reply: int = 0  # not 0: this frame answers the one whose `ask` was this number


_FRAME: TypeAdapter[Frame] = TypeAdapter(Frame)


def encode(frame: Frame) -> bytes:
    """The frame as one line: JSON escapes every newline inside it, and one ends it."""
    return _FRAME.dump_json(frame) + b"\n"


def decode(line: bytes) -> Frame:
    """The frame on a line; its message is the class its `type` names, each field checked
    strictly (no coercion); anything else raises MessageError."""
    try:
        return _FRAME.validate_json(line, strict=True)
    except ValidationError as exc:
        raise MessageError(_first_fault(exc)) from None  # the error's text holds the values

"""Pure checks that turn one HTTP answer into the JSON the engine needs, or a SidecarError."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.skyrl.errors import SidecarError, clip

_NOT_JSON = object()


@dataclass(frozen=True)
class Answer:
    """What came back for one request: enough to check it and to say where it came from."""

    method: str
    url: str
    status: int
    body: bytes
    content_type: str = ""
    request_id: str | None = None
    retry_after: float | None = None
    weight_version: str | None = None
    weight_version_end: str | None = None  # where the version changed before the headers went

    def fail(
        self,
        message: str,
        reason: str = "malformed_response",
        *,
        envelope: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> SidecarError:
        return SidecarError(
            message,
            reason=reason,
            method=self.method,
            url=self.url,
            status=self.status,
            request_id=request_id or self.request_id,
            envelope=envelope,
            retry_after=self.retry_after,
        )

    def text(self) -> str:
        return clip(self.body.decode("utf-8", "replace")) or "an empty body"


def check_json_object(answer: Answer) -> dict[str, Any]:
    """The body as a JSON object, or ``SidecarError`` for an envelope, a status >= 400 or junk."""
    try:
        parsed: Any = json.loads(answer.body)
    except ValueError:
        parsed = _NOT_JSON
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if error:
        detail = error if isinstance(error, dict) else {"message": str(error)}
        message = detail.get("message") or f"error envelope without a message: {clip(str(error))}"
        reason = detail.get("reason") or ("http_error" if answer.status >= 400 else "error_body")
        rid = detail.get("request_id")
        raise answer.fail(
            str(message),
            str(reason),
            envelope={"error": detail},
            request_id=str(rid) if rid else None,
        )
    if answer.status >= 400:
        raise answer.fail(
            f"HTTP {answer.status} without an error envelope: {answer.text()}", "http_error"
        )
    if not isinstance(parsed, dict):
        got = f"JSON {type(parsed).__name__}"
        if parsed is _NOT_JSON:
            got = f"non-JSON {answer.content_type or 'data'}"
        raise answer.fail(f"expected a JSON object, got {got}: {answer.text()}")
    return parsed


def check_choices(answer: Answer, body: Mapping[str, Any], prompts: int) -> list[dict[str, Any]]:
    """One completion choice per prompt, indexed 0..prompts-1, returned in prompt order."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise answer.fail(f"the completion has no 'choices' list: {answer.text()}")
    if len(choices) != prompts:
        raise answer.fail(f"{len(choices)} choices came back for {prompts} prompts")
    by_index: dict[int, dict[str, Any]] = {}
    for choice in choices:
        index = choice.get("index") if isinstance(choice, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < prompts:
            raise answer.fail(f"a choice has no index in 0..{prompts - 1}: {clip(repr(choice))}")
        if index in by_index:
            raise answer.fail(f"two choices have index {index}")
        if not isinstance(choice.get("text"), str):
            raise answer.fail(f"choice {index} has no 'text' string: {clip(repr(choice))}")
        by_index[index] = choice
    return [by_index[i] for i in range(prompts)]

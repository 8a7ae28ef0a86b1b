"""The fake vLLM speaks as vLLM's Rust frontend here (`FakeVLLM(frontend="rust")`): the tests
that read vLLM's bytes (counts, continuation, error bodies) run again against its framing."""

from __future__ import annotations

import pytest

from tests.fake_vllm import FakeVLLM


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM(frontend="rust")

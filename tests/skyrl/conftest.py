"""Fixtures for the SkyRL tests: a real tokenizer, and the fake vLLM serving the seed's model."""

from __future__ import annotations

# Must run before anything imports skyrl: skyrl 0.2.0 does not import on Python 3.11 as
# released, and tests.skyrl.seed imports it with a test-only workaround (see _import_skyrl
# there, which says why). It lives in seed.py, not here, so that suites outside tests/skyrl
# (the real-vLLM tests) get the same import when they reuse the seed helper.
import tests.skyrl.seed  # noqa: F401  # isort: skip

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.fake_vllm import FakeVLLM
from tests.skyrl_deployment import HF_PATH, SERVED


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM(served=[(SERVED, HF_PATH)])


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A real transformers tokenizer, built locally (no hub): words of the fake's replies."""
    words = ["[UNK]", "fox", "t0", "t1", "t2"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")

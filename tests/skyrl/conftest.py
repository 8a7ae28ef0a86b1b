"""Fixtures for the SkyRL tests: a tokenizer, the fake vLLM and the sidecar on real ports."""

from __future__ import annotations

# Must run before anything imports skyrl: skyrl 0.2.0 does not import on Python 3.11 as
# released, and tests.skyrl.seed imports it with a test-only workaround (see _import_skyrl
# there, which says why). It lives in seed.py, not here, so that suites outside tests/skyrl
# (the real-vLLM tests) get the same import when they reuse the seed helper.
import tests.skyrl.seed  # noqa: F401  # isort: skip

#!/usr/bin/env bash
# SkyRL 0.2.0 (the last release with RemoteInferenceEngine) for the `skyrl` tests, without CUDA.
# skyrl's own dependency list pulls CUDA builds of torch and vLLM, so it is installed with
# --no-deps plus the handful of packages its inference-engine modules import; torch is pinned to
# the CPU wheel this machine serves locally (a bare `torch` would fetch a multi-GB CUDA build).
set -euo pipefail
VENV=${VENV:-.venv}
packages=(
  skyrl==0.2.0
  torch==2.13.0
  ray==2.51.1
  transformers==5.3.0
  skyrl-gym==0.3.0
  pydantic
  aiohttp
  loguru
  fastapi
  uvicorn
  omegaconf
)
stamp="$VENV/.stamp-skyrl-$(printf '%s\n' "${packages[@]}" | sha256sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
# --no-deps for skyrl alone; the rest resolve their own (CPU-only) dependencies normally.
# skyrl's unmet extras (datasets, peft, ...) are expected: only its inference-engine modules run.
"$VENV/bin/pip" install -q --no-deps "${packages[0]}"
"$VENV/bin/pip" install -q --no-warn-conflicts "${packages[@]:1}"
touch "$stamp"

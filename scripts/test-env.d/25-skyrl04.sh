#!/usr/bin/env bash
# A separate Python 3.12 venv with SkyRL 0.4.0 (RemoteInferenceClient) for tests/skyrl04; idempotent.
#
# skyrl 0.4.0 needs Python >= 3.12, and its client module imports torch when it loads (type hints
# and `torch.int32`). The machine's local CPU torch wheel is for 3.11 only, so on 3.12 the
# registry's torch==2.13.0 is the CUDA build: measured here, about 1.4 GB downloaded (torch 527 MB,
# cudnn, nccl, triton; the other nvidia wheels are served locally), 2-3 minutes, 4.7 GB on disk.
# It imports and runs on CPU. skyrl itself goes in with --no-deps (its list pulls jax, peft,
# datasets, ...), plus exactly what its inference_servers modules and skyrl.train.config import.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/../.."
VENV04=${SKYRL04_VENV:-.venv-skyrl04}
packages=(
  skyrl==0.4.0
  torch==2.13.0
  numpy
  orjson
  pybase64
  aiohttp
  loguru
  cloudpathlib
  pydantic
  rich
  pyyaml
  omegaconf
  skyrl-gym
  # SkyRL's own vllm-router over `external_server_urls` (tests/skyrl04/test_training_loop.py).
  # skyrl pins none; 0.1.17 is the newest and needs the RouterArgs fix in tests/skyrl04/router.py.
  vllm-router==0.1.17
  httpx
)

# python3.12 from PATH, else from pyenv (its shim fails when 3.12 is not the selected version).
find_python312() {
  local candidate
  for candidate in "${PYTHON312:-}" python3.12 \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

stamp="$VENV04/.stamp-$(cat "$self" pyproject.toml | sha256sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
python312=$(find_python312) || {
  echo "25-skyrl04: no Python 3.12 found (set PYTHON312); tests/skyrl04 will fail" >&2
  exit 1
}
echo "building $VENV04 (skyrl==0.4.0 on $python312, 2-3 minutes)" >&2
start=$SECONDS
[ -x "$VENV04/bin/python" ] || "$python312" -m venv "$VENV04"
"$VENV04/bin/pip" install -q --upgrade pip
"$VENV04/bin/pip" install -q --no-deps "${packages[0]}"
# skyrl's unmet requirements (datasets, peft, ...) are expected: only its client modules run.
"$VENV04/bin/pip" install -q --no-warn-conflicts "${packages[@]:1}" -e '.[dev]'
"$VENV04/bin/python" -c \
  'import skyrl.backends.skyrl_train.inference_servers.remote_inference_client, proxy.skyrl'
echo "built $VENV04 in $((SECONDS - start)) s, $(du -sh "$VENV04" | cut -f1)" >&2
touch "$stamp"

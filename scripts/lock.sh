#!/usr/bin/env bash
# `make lock`: what the image installs, pinned with hashes, from pyproject.toml.
#   requirements/runtime.txt  [project] dependencies and everything they pull in
#   requirements/build.txt    [build-system] requires (the backend that builds the wheel)
# One universal lock per file (uv's --universal): every platform and every Python from
# requires-python's floor up, with environment markers where they differ, so the same files
# serve python:3.12-slim on amd64 and arm64 and the local 3.11 base. Existing pins are kept
# while they still satisfy pyproject.toml; pass uv's own flags to move them:
#   make lock LOCK_ARGS=--upgrade    or    LOCK_ARGS='--upgrade-package aiohttp'
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8 # pinned: another uv may write the same pins in other words
LOCK_VENV=${LOCK_VENV:-.venv-lock}
PYTHON_FLOOR=3.11 # pyproject.toml's requires-python; tests/image/test_lock.py holds them equal

if ! "$LOCK_VENV/bin/uv" --version 2>/dev/null | grep -q "^uv $UV_VERSION "; then
  [ -x "$LOCK_VENV/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$LOCK_VENV"
  "$LOCK_VENV/bin/pip" install -q "uv==$UV_VERSION"
fi

compile() {
  "$LOCK_VENV/bin/uv" pip compile --quiet --universal --python-version "$PYTHON_FLOOR" \
    --generate-hashes --custom-compile-command 'make lock' "$@"
}

mkdir -p requirements
# The otel extra too: tracing is turned on by an environment variable (docs/tracing.md), so the
# image carries what it needs; with tracing off nothing of it is imported.
compile pyproject.toml --extra otel -o requirements/runtime.txt "$@"
"$LOCK_VENV/bin/python" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))
' | compile - -o requirements/build.txt "$@"
echo "locked: $(grep -c '==' requirements/runtime.txt) runtime and" \
  "$(grep -c '==' requirements/build.txt) build packages (requirements/)" >&2

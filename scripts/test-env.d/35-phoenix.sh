#!/usr/bin/env bash
# Arize Phoenix, a real OTLP receiver that users run, in a venv of its own (.venv-phoenix, about
# 850 MB, 90 s): tests/test_tracing.py sends it the sidecar's spans over OTLP/HTTP and reads them
# back through its own REST API. Its dependencies (SQLAlchemy, grpc, pandas, ...) stay out of
# the sidecar's venv. Pinned so a new release never turns CI red on its own; idempotent.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/../.."
PYTHON=${PYTHON:-python3.11}
PHOENIX_VENV=${PHOENIX_VENV:-.venv-phoenix}
PHOENIX_VERSION=${PHOENIX_VERSION:-20.26.1}

stamp="$PHOENIX_VENV/.stamp-$(sha256sum "$self" | cut -c1-12)"
[ -f "$stamp" ] && exit 0
[ -x "$PHOENIX_VENV/bin/python" ] || "$PYTHON" -m venv "$PHOENIX_VENV"
"$PHOENIX_VENV/bin/pip" install -q --upgrade pip
"$PHOENIX_VENV/bin/pip" install -q "arize-phoenix==$PHOENIX_VERSION"
# Fail here, not in the middle of a test run, if the server cannot even import.
"$PHOENIX_VENV/bin/python" -c 'import phoenix.server.main'
rm -f "$PHOENIX_VENV"/.stamp-*
touch "$stamp"

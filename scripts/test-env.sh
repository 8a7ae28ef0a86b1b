#!/usr/bin/env bash
# Build everything the test suite needs on a fresh machine; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

# System tools: promtool (prometheus), nginx and wrk for the bench smoke.
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v nginx >/dev/null || need+=(nginx)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (run as root or install them)" >&2
  fi
fi

stamp="$VENV/.stamp-$(sha256sum pyproject.toml scripts/test-env.sh | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e '.[dev]'
  touch "$stamp"
fi

# Optional parts add themselves here (each script is idempotent).
for part in scripts/test-env.d/*.sh; do
  [ -e "$part" ] && VENV="$VENV" bash "$part"
done
exit 0

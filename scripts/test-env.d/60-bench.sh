#!/usr/bin/env bash
# The bench smoke (tests/bench) needs nginx with its Lua module and wrk: bench/setup-system.sh;
# and matplotlib for the chart bench/run.py draws, in a venv of its own (.venv-bench-chart,
# pinned in bench/proxies/requirements-peers.txt), so the runner stays standard-library Python.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash bench/setup-system.sh
pin=$(grep '^matplotlib==' bench/proxies/requirements-peers.txt)
stamp=.venv-bench-chart/.stamp-$(echo "$pin" | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  [ -x .venv-bench-chart/bin/python ] || python3.11 -m venv .venv-bench-chart
  .venv-bench-chart/bin/pip install -q "$pin"
  touch "$stamp"
fi

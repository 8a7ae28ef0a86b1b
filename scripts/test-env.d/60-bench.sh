#!/usr/bin/env bash
# The bench smoke (tests/bench) needs nginx with its Lua module and wrk: bench/setup-system.sh.
set -euo pipefail
bash "$(dirname "$0")/../../bench/setup-system.sh"

#!/usr/bin/env bash
# Build everything the test suite needs on a fresh machine; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

# System tools, in one apt transaction: promtool and a Prometheus server (tests/deploy), nginx with
# its Lua module and wrk (the bench smoke), openssl's CLI (the TLS upstream's certificates),
# valgrind and libfaketime (`make perf-budget`: instructions under callgrind, the clock slowed).
# The parts under test-env.d check again for themselves.
need=()
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
command -v nginx >/dev/null || need+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || need+=(libnginx-mod-http-lua)
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
command -v openssl >/dev/null || need+=(openssl)
command -v callgrind_control >/dev/null || need+=(valgrind)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(faketime)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (run as root or install them)" >&2
  fi
fi

stamp="$VENV/.stamp-$(sha256sum pyproject.toml scripts/test-env.sh | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  start=$SECONDS
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e '.[dev]'
  touch "$stamp"
  echo "timed: test-env/venv $((SECONDS - start)) s, exit 0"
fi

# Optional parts add themselves here (each script is idempotent). They run side by side: each
# builds a venv of its own or installs a system package (apt waits for its lock), and most of
# their time is downloads. The parts that install into the test venv itself ($VENV) run one
# after the other, in one job, since two pips in one venv at once can break it; so do the two
# that make the vLLM venv (15-vllm-rs puts its binary into the venv 10-vllm builds).
shared_venv=(20-skyrl 30-deploy-tools)
vllm_venv=(10-vllm 15-vllm-rs)
logs=$(mktemp -d)
run_part() {
  local part=$1 name
  name=$(basename "$part" .sh)
  VENV="$VENV" bash scripts/timed.sh "test-env/$name" bash "$part" >"$logs/$name.log" 2>&1
}
pids=()
for part in scripts/test-env.d/*.sh; do
  name=$(basename "$part" .sh)
  [[ " ${shared_venv[*]} ${vllm_venv[*]} " == *" $name "* ]] && continue
  run_part "$part" &
  pids+=($!)
done
run_in_order() {
  for name in "$@"; do
    [ -e "scripts/test-env.d/$name.sh" ] || continue
    run_part "scripts/test-env.d/$name.sh" || return 1
  done
}
run_in_order "${shared_venv[@]}" &
pids+=($!)
run_in_order "${vllm_venv[@]}" &
pids+=($!)
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
for log in "$logs"/*.log; do
  if [ "$failed" = 1 ] || grep -q "^timed: .*, exit [^0]" "$log"; then
    echo "== $(basename "$log" .log)" >&2
    cat "$log" >&2
  else
    grep "^timed: " "$log"
  fi
done
rm -rf "$logs"
exit "$failed"

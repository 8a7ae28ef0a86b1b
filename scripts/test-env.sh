#!/usr/bin/env bash
# Build everything the test suite needs on a fresh machine; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

# System tools, in one apt transaction: promtool and a Prometheus server (tests/deploy), nginx with
# its Lua module and wrk (the bench smoke), openssl's CLI (the TLS upstream's certificates). The
# parts under test-env.d check again for themselves.
need=()
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
command -v nginx >/dev/null || need+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || need+=(libnginx-mod-http-lua)
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
command -v openssl >/dev/null || need+=(openssl)
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

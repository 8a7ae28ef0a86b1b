#!/usr/bin/env bash
# Write tests/unit/core/vllm_routes/<version>.json: the routes a vLLM release mounts
# (scripts/vllm_routes.py), which tests/unit/core/test_vllm_routes.py holds the route table to.
#
#   bash scripts/vllm-routes.sh          # the vLLM installed in .venv-vllm (make test-env)
#   bash scripts/vllm-routes.sh 0.33.0   # another release, from its wheel's source
#
# Another release is read from its wheel (pip download, about 330 MB, kept under
# .cache/vllm-<version>/ so that a second run downloads nothing), run by .venv-vllm's python:
# building the app imports the release's entrypoints, not its compiled kernels. A package that
# release needs and the venv lacks goes into .cache/vllm-<version>/extra (0.33: orjson).
# Idempotent; not part of `make test` (the files are checked in, so CI downloads nothing).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
python="$VLLM_VENV/bin/python"
out=tests/unit/core/vllm_routes
installed=$("$python" -c 'import importlib.metadata as m; print(m.version("vllm").split("+")[0])')
version=${1:-$installed}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

if [ "$version" = "$installed" ]; then
    "$python" scripts/vllm_routes.py >"$tmp"
else
    cache=.cache/vllm-$version
    mkdir -p "$cache"
    compgen -G "$cache/vllm-$version-*.whl" >/dev/null ||
        pip download -q --no-deps -d "$cache" "vllm==$version"
    [ -d "$cache/src/vllm" ] ||
        unzip -q -o "$cache"/vllm-"$version"-*.whl -x '*.so' 'vllm/third_party/*' -d "$cache/src"
    [ -d "$cache/extra/orjson" ] ||
        "$python" -m pip install -q --no-deps --target "$cache/extra" orjson
    PYTHONPATH="$cache/src:$cache/extra" "$python" scripts/vllm_routes.py >"$tmp"
fi
mv "$tmp" "$out/$version.json"
trap - EXIT
echo "$out/$version.json: $(grep -c '^  "/' "$out/$version.json") routes" >&2

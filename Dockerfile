# syntax=docker/dockerfile:1
# The sidecar alone (vLLM runs in its own container): its locked dependencies and its wheel
# installed into a venv in a build stage, the venv copied onto a clean slim base that runs it as
# a numeric non-root user. tests/image/ builds and runs this file (docs/deploy.md).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# The dependencies first, from the locks (`make lock`), each file checked against its hash: a
# layer that a change to the code alone does not rebuild. The build backend gets a venv of its
# own that stays in this stage.
COPY requirements/ ./requirements/
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements/build.txt \
    && python3 -m venv /opt/vllm-sidecar \
    && /opt/vllm-sidecar/bin/pip install --no-cache-dir --require-hashes -r requirements/runtime.txt
# Then the package alone (.dockerignore keeps the context to these files): --no-deps, so nothing
# unlocked comes in, and `pip check` fails the build if the lock lacks what pyproject.toml asks.
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN /opt/build/bin/pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /wheels . \
    && /opt/vllm-sidecar/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
    && /opt/vllm-sidecar/bin/pip check

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-sidecar" \
      org.opencontainers.image.description="Reverse-proxy sidecar for vLLM: model-name resolution, error envelopes, Prometheus metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/vllm-sidecar /opt/vllm-sidecar
# Numeric user so Kubernetes' runAsNonRoot can verify it without an /etc/passwd lookup.
USER 65532:65532
ENV PATH=/opt/vllm-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_SIDECAR_HOST=0.0.0.0 \
    VLLM_SIDECAR_PORT=8080 \
    VLLM_SIDECAR_ADMIN_PORT=8081 \
    VLLM_SIDECAR_WORKERS=1
# 8080: the proxy (clients and SkyRL); 8081: admin (/metrics, /livez, /readyz, /models).
# VLLM_SIDECAR_WORKERS: processes on the proxy port (0: one per CPU of the container's limit);
# above 1 they need a writable /tmp (docker run --tmpfs /tmp with --read-only).
EXPOSE 8080 8081
# The slim base has no curl: Python's urllib is enough. /livez never depends on vLLM, so a slow
# or restarting vLLM does not make Docker restart the sidecar.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('VLLM_SIDECAR_ADMIN_PORT', '8081'), timeout=2)"]
# Exec form: the sidecar is PID 1 and gets SIGTERM itself, so its shutdown grace applies.
ENTRYPOINT ["vllm-sidecar"]

#!/usr/bin/env bash
# The image from the shipped Dockerfile, built here as CI builds it (`make image`, and
# tests/image/ in `make test`): buildah, chroot isolation, on the local base that
# scripts/image-base.sh makes (no image registry is reachable here). Docker users build the same
# file with `docker build .` on the public python image: docs/deploy.md.
#
#   scripts/image.sh build   build (layers cached between runs); print the image's id and its
#                            base's name on stdout, its name, size and build time on stderr
#   scripts/image.sh clean   remove the images this makes, the base and the cached layers
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
IMAGE=${IMAGE:-localhost/vllm-sidecar:test}

build() {
  local base start iidfile id
  base=$(bash scripts/image-base.sh)
  start=$SECONDS
  iidfile=$(mktemp)
  trap 'rm -f "$iidfile"' RETURN
  # --format docker: the OCI image config has no HEALTHCHECK, and Docker's keeps it.
  # --network host: pip reaches the package index as this machine does.
  # --pull=never: the base is local, and no registry could answer anyway.
  buildah bud --isolation chroot --network host --layers --pull=never --format docker \
    --build-arg "PYTHON_IMAGE=$base" --iidfile "$iidfile" -t "$IMAGE" . >&2
  id=$(cat "$iidfile")
  echo "image: $IMAGE ($id) on $base: $(size "$id"), built in $((SECONDS - start)) s" >&2
  printf '%s\n' "$id" "$base"
}

size() {
  buildah images --noheading --format '{{.Size}}' "${1#sha256:}"
}

clean() {
  buildah rmi -f "$IMAGE" >/dev/null 2>&1 || true
  for base in $(buildah images --noheading --format '{{.Name}}:{{.Tag}}' \
    --filter reference=localhost/vllm-sidecar-base); do
    buildah rmi -f "$base" >/dev/null 2>&1 || true
  done
  buildah rmi --prune >/dev/null 2>&1 || true # the untagged layers --layers kept
}

case ${1:-build} in
  build) build ;;
  clean) clean ;;
  *)
    echo "usage: $0 build|clean" >&2
    exit 2
    ;;
esac

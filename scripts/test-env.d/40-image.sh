#!/usr/bin/env bash
# The image tests (tests/image/) build the shipped Dockerfile and run it: buildah (the build and
# the container, chroot isolation) and debootstrap (the local base, since no image registry is
# reachable here) from Debian; then the base itself, once (scripts/image-base.sh: about a minute
# the first time, a lookup after). Idempotent: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "40-image: need root to apt-get install ${need[*]}" >&2
    exit 1
  fi
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${need[@]}" >/dev/null
fi

bash scripts/image-base.sh >/dev/null

#!/usr/bin/env bash
# A local stand-in for the Dockerfile's base image (python:3.12-slim-bookworm), for machines that
# reach no image registry: Debian bookworm from this machine's own apt mirror (debootstrap,
# minbase), with Python, venv and `python` as `python3`, imported into buildah's store. Prints
# the image's name. Idempotent: the name carries a stamp of this recipe and of the pip trust and
# index settings it copies in, so a second run is a lookup and any change makes a new base.
#
# As a corporate base image would, it carries this machine's pip settings: the CA bundle pip
# trusts here (an intercepting proxy's CA) and any http(s) index, as PIP_* environment variables,
# so that the Dockerfile's `pip install` works unchanged. Its Python is Debian's 3.11, not 3.12:
# no 3.12 is packaged for bookworm, and the sidecar supports both.
set -euo pipefail
self=$(readlink -f "$0")
SUITE=bookworm
PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
REPO=localhost/vllm-sidecar-base

# pip's own setting first (environment, then its config files), then what requests would use.
pip_setting() {
  local key=$1
  { python3 -m pip config list 2>/dev/null || true; } |
    sed -n "s/^\(global\|install\|:env:\)\.$key='\(.*\)'\$/\2/p" | tail -n 1
}

ca_bundle() {
  local cert
  cert=$(pip_setting cert)
  cert=${cert:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}
  [ -n "$cert" ] && [ -f "$cert" ] && readlink -f "$cert"
  return 0
}

# Only http(s) indexes mean anything inside the build; file:// ones are this machine's disk.
http_indexes() {
  local key=$1 url
  for url in $(pip_setting "$key"); do
    case $url in http://* | https://*) printf '%s ' "$url" ;; esac
  done
}

# The Debian mirror apt uses here, so debootstrap goes where this machine's packages come from.
debian_mirror() {
  command -v apt-get >/dev/null || return 0
  # shellcheck disable=SC2016 # $(REPO_URI) is apt's field, not the shell's
  apt-get indextargets --format '$(REPO_URI)' "Codename: $SUITE" 'Origin: Debian' \
    'TARGET_OF: deb' 2>/dev/null | head -n 1
}

cert=$(ca_bundle)
index=$(http_indexes index-url)
extra=$(http_indexes extra-index-url)
stamp=$({
  cat "$self"
  [ -z "$cert" ] || cat "$cert"
  printf '%s\n' "$index" "$extra"
} | sha256sum | cut -c1-12)
image="$REPO:$SUITE-$stamp"
if buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

start=$SECONDS
work=$(mktemp -d /var/tmp/vllm-sidecar-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
echo "image-base: debootstrap $SUITE (about a minute)" >&2
# shellcheck disable=SC2046 # an empty mirror is no argument: debootstrap's default
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" $(debian_mirror) \
  >"$work/debootstrap.log" 2>&1 || {
  tail -n 20 "$work/debootstrap.log" >&2
  exit 1
}
# What a slim image leaves out: package lists and caches, documentation, translations.
rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc "$rootfs"/usr/share/man \
  "$rootfs"/usr/share/locale

env_args=()
if [ -n "$cert" ]; then
  # The bundle as a whole: it is Debian's list plus this machine's own CAs.
  cp "$cert" "$rootfs/etc/ssl/certs/pip-ca-bundle.crt"
  env_args+=(--env PIP_CERT=/etc/ssl/certs/pip-ca-bundle.crt)
fi
[ -z "$index" ] || env_args+=(--env "PIP_INDEX_URL=${index% }")
[ -z "$extra" ] || env_args+=(--env "PIP_EXTRA_INDEX_URL=${extra% }")

tar -C "$rootfs" -cf "$work/rootfs.tar" .
container=$(buildah from scratch)
buildah add --quiet "$container" "$work/rootfs.tar" / >/dev/null
buildah config "${env_args[@]}" --cmd '["python3"]' \
  --label "org.opencontainers.image.description=local $SUITE base for vllm-sidecar's image tests" \
  "$container"
buildah commit --quiet --rm "$container" "$image" >/dev/null
# Older bases (an earlier stamp) are no longer used by anything.
for old in $(buildah images --noheading --format '{{.Name}}:{{.Tag}}' --filter "reference=$REPO"); do
  [ "$old" = "$image" ] || buildah rmi "$old" >/dev/null 2>&1 || true
done
echo "image-base: $image made in $((SECONDS - start)) s" >&2
echo "$image"

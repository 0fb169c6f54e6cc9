#!/usr/bin/env bash
# The image of examples/container/Containerfile, built by podman with no
# registry: its base is the minimal Debian the wheel check makes (bookworm
# minbase with python3 and python3-venv, cached in /var/cache/gpulaunch),
# imported with `podman import`, and the wheel from scripts/wheel.sh. Both are
# kept in podman's store, tagged by a key of their inputs, so a second run
# builds nothing. Prints the image's name as its last line; exits non-zero with
# the reason when podman cannot build or run it here.
# podman on these machines: runc (crun refuses their cgroup layout) and ulimits
# below the machine's hard limits (podman's defaults are above them).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_DIR=${GPULAUNCH_CACHE_DIR:-/var/cache/gpulaunch}
CONTAINERFILE=examples/container/Containerfile
PODMAN_OPTS=(--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

die() {
  echo "container image: FAILED: $*" >&2
  exit 1
}
command -v podman >/dev/null || die "podman is missing: run scripts/deps.sh"
shopt -s nullglob
wheels=(build/wheel/wheelhouse/gpulaunch-*.whl)
roots=("$CACHE_DIR"/rootfs-bookworm-minbase-*.tar.gz)
shopt -u nullglob
[ ${#wheels[@]} = 1 ] || die "expected one wheel in build/wheel/wheelhouse: run scripts/wheel.sh"
[ ${#roots[@]} -ge 1 ] || die "no minimal Debian in $CACHE_DIR: run scripts/wheel_check.sh first"
root=${roots[0]}
base=localhost/gpulaunch-base:$(sha256sum "$root" | cut -c1-12)
image=localhost/gpulaunch-test:$(cat "$CONTAINERFILE" "${wheels[0]}" "$root" | sha256sum | cut -c1-12)
if ! podman image exists "$base"; then
  zcat "$root" | podman import - "$base" >/dev/null || die "podman import of $root failed"
fi
if ! podman image exists "$image"; then
  t=$SECONDS
  podman build "${PODMAN_OPTS[@]}" --network none --build-arg BASE="$base" -f "$CONTAINERFILE" \
    -t "$image" build/wheel/wheelhouse >build/container-build.log 2>&1 ||
    { tail -n 20 build/container-build.log >&2; die "podman build failed (log above)"; }
  echo "container image: built $image in $((SECONDS - t)) s" >&2
fi
podman run --rm "${PODMAN_OPTS[@]}" --network none "$image" --help >/dev/null 2>&1 ||
  die "podman cannot run $image here: podman run --rm ${PODMAN_OPTS[*]} --network none $image --help"
echo "container image: $image, $(podman image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')" >&2
echo "$image"

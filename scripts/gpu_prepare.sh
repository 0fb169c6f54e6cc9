#!/usr/bin/env bash
# Run here, before scripts/gpu_check.sh travels to a GPU machine where nothing
# can be installed: fetches the Debian packages the build needs (headers and
# libraries) and unpacks them into .gpudeps/ (git-ignored; carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libuv1 libuv1-dev libyaml-0-2 libyaml-dev libssl3 libssl-dev libmicrohttpd12
      libmicrohttpd-dev libcurl4 libcurl4-openssl-dev libcriterion3 libcriterion-dev
      libnanomsg5 libprotobuf-c1 libgit2-1.5 libboxfort0 libffi8)
rm -rf .gpudeps && mkdir -p .gpudeps/debs
(cd .gpudeps/debs && apt-get download "${pkgs[@]}" >/dev/null 2>&1 ||
  { echo "gpu_prepare: apt-get download failed; run apt-get update first" >&2; exit 1; })
for d in .gpudeps/debs/*.deb; do dpkg -x "$d" .gpudeps/root; done
rm -rf .gpudeps/debs
# pkg-config files point at /usr: make them relative to where they travel
find .gpudeps/root -name '*.pc' -exec sed -i 's|^prefix=/usr|prefix=${pcfiledir}/../../..|' {} +
du -sh .gpudeps

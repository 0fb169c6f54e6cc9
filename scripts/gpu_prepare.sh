#!/usr/bin/env bash
# Run here, before scripts/gpu_check.sh travels to a GPU machine where nothing
# can be installed: fetches the Debian packages the build needs (headers and
# libraries) and unpacks them into .gpudeps/ (git-ignored; carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libuv1 libuv1-dev libyaml-0-2 libyaml-dev libssl3 libssl-dev libmicrohttpd12
      libmicrohttpd-dev libcurl4 libcurl4-openssl-dev libcriterion3 libcriterion-dev libjansson4 libjansson-dev
      libnanomsg5 libgit2-1.5 libffi8 libhttp-parser2.9 libhttp-parser-dev libmbedtls14 libmbedx509-1 libmbedcrypto7
      libssh2-1 libnghttp2-14 librtmp1 libpsl5 libbrotli1 libldap-2.5-0 libsasl2-2
      libgnutls30 libnettle8 libhogweed6 libidn2-0 libunistring2 libtasn1-6 libp11-kit0 libgmp10)
rm -rf .gpudeps && mkdir -p .gpudeps/debs
(cd .gpudeps/debs && apt-get download "${pkgs[@]}" >/dev/null 2>&1 ||
  { echo "gpu_prepare: apt-get download failed; run apt-get update first" >&2; exit 1; })
for d in .gpudeps/debs/*.deb; do dpkg -x "$d" .gpudeps/root; done
rm -rf .gpudeps/debs
# pkg-config files point at /usr: make them relative to where they travel
find .gpudeps/root -name '*.pc' -exec sed -i 's|^prefix=/usr|prefix=${pcfiledir}/../../..|' {} +
du -sh .gpudeps

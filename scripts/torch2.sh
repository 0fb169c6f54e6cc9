#!/usr/bin/env bash
# Today's PyTorch for the tests, beside Debian 12's torch 1.13: a virtual
# environment of Debian's python3 with PyPI's torch (GPULAUNCH_TORCH2_VERSION,
# default below, with the CUDA libraries PyPI's wheel depends on: about 3 GB
# downloaded, 6 GB installed), pytest, and the frameworks people train with
# (PyTorch Lightning, Hugging Face Accelerate). Cached in /var/cache/gpulaunch:
# the wheels once, the environment keyed by the versions and the interpreter,
# so only the first run downloads and installs (a few minutes); later runs
# check it in a second. Prints the environment's python as its last line;
# exits non-zero with the reason when it cannot be made.
set -euo pipefail

VERSION=${GPULAUNCH_TORCH2_VERSION:-2.15.0}
PACKAGES=("torch==$VERSION" pytest lightning accelerate numpy)
CACHE_DIR=${GPULAUNCH_CACHE_DIR:-/var/cache/gpulaunch}
PY=/usr/bin/python3 # the interpreter the tests use for Debian's torch too

die() {
  echo "torch2: FAILED: $*" >&2
  exit 1
}
[ -x $PY ] || die "$PY is missing: run scripts/deps.sh"
$PY -c 'import venv, ensurepip' 2>/dev/null || die "python3-venv is missing: run scripts/deps.sh"
pyver=$($PY -c 'import sys; print("%d%d" % sys.version_info[:2])')
key=$(printf '%s\n' "$pyver" "${PACKAGES[@]}" | sha256sum | cut -c1-12)
venv=$CACHE_DIR/torch2-py$pyver-$key
wheels=$CACHE_DIR/wheels

check() {
  "$venv/bin/python" - "$VERSION" <<'EOF' 2>/dev/null
import sys
import torch, pytest, lightning, accelerate, numpy  # noqa: F401
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
EOF
}

if [ -x "$venv/bin/python" ] && check; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$wheels"
t=$SECONDS
# the wheels first (kept: a new environment needs no download), then offline
$PY -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheels" "${PACKAGES[@]}" ||
  die "pip could not download ${PACKAGES[*]} from PyPI"
echo "torch2: wheels in $wheels ($((SECONDS - t)) s, $(du -sh "$wheels" | cut -f1))" >&2
rm -rf "$venv" "$venv.tmp"
$PY -m venv "$venv.tmp" || die "could not make a virtual environment"
"$venv.tmp/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  --find-links "$wheels" "${PACKAGES[@]}" || die "pip could not install ${PACKAGES[*]} from $wheels"
# renamed only when whole: an interrupted run leaves no half environment
# (the scripts in bin/ keep the old path; the tests run `python -m`)
mv "$venv.tmp" "$venv"
check || {
  rm -rf "$venv"
  die "the new environment does not import torch $VERSION"
}
echo "torch2: torch $VERSION in $venv ($((SECONDS - t)) s)" >&2
echo "$venv/bin/python"

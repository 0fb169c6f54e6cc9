#!/usr/bin/env bash
# The plain suite RUNS times in a row with one core kept busy beside it: a test
# that fails even once under load is a defect (docs/reliability.md, "A suite
# that passes every time"). Uses the build that scripts/test.sh made
# (build/test), or BUILD_DIR; builds it first if it is missing.
#
#   scripts/suite_loaded.sh [RUNS] [BUILD_DIR]       (default 5, build/test)
#
# Each run's ctest output is kept in BUILD_DIR/loaded/run-N.log (a failed
# run's network-namespace bed logs in run-N-fault-logs/). After each run it
# looks for what the tests must not leave behind (the runtime's /dev/shm
# segments, the beds' network namespaces, the tests' /tmp/gpl-* folders, a
# process of the build still running): anything new since the run began
# fails the run, is listed and removed. Ends with each run's time and failed
# tests, and the tests that failed at least once.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
dir=${2:-build/test}
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$dir/CTestTestfile.cmake" ]; then
  torch2=$(scripts/torch2.sh | tail -n 1)
  s3py=$(scripts/s3server.sh | tail -n 1)
  cmake -S . -B "$dir" -DGPULAUNCH_WERROR=ON -DGPULAUNCH_TORCH2_PYTHON="$torch2" \
    -DGPULAUNCH_S3_PYTHON="$s3py" >/dev/null
fi
cmake --build "$dir" -j"$jobs" >/dev/null
mkdir -p "$dir/loaded"

# the load: one process spinning on one core for the whole of every run
load_pid=
stop_load() { [ -z "$load_pid" ] || kill "$load_pid" 2>/dev/null || true; }
trap stop_load EXIT
sh -c 'while :; do :; done' &
load_pid=$!

# what a run's tests own and must not leave behind, one line each
leftovers() {
  ls -d /dev/shm/gpulaunch-* /tmp/gpl-* 2>/dev/null || true
  ip netns list 2>/dev/null | awk '$1 ~ /^gplt/ {print "netns " $1}'
  local b
  b=$(cd "$dir" && pwd)
  pgrep -af "^$b/" | sed 's/^/process /' || true
}
remove_left() {
  local l
  while read -r l; do
    case "$l" in
    "netns "*) ip netns del "${l#netns }" 2>/dev/null || true ;;
    "process "*) l=${l#process }; kill -9 "${l%% *}" 2>/dev/null || true ;;
    /*) rm -rf "$l" ;;
    esac
  done
}

summary=()
declare -A failed_in=()
for i in $(seq 1 "$runs"); do
  log="$dir/loaded/run-$i.log"
  before=$(leftovers | sort)
  t0=$(date +%s)
  rc=0
  (cd "$dir" && ctest --output-on-failure -j"$jobs" --timeout 300) >"$log" 2>&1 || rc=$?
  took=$(($(date +%s) - t0))
  fails=$(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (.*/\1/p' "$log" | tr '\n' ' ')
  sleep 2 # a test's last children reaped
  left=$(comm -13 <(echo "$before") <(leftovers | sort) | grep -v '^$' || true)
  if [ -n "$left" ]; then
    rc=1
    fails="${fails}left-behind "
    { echo "== left behind by run $i:"; echo "$left"; } | tee -a "$log"
    echo "$left" | remove_left
  fi
  # the next run's beds write over the nodes' logs: a failed run's are kept beside its log
  if [ "$rc" != 0 ] && [ -d "$dir/test/fault-logs" ]; then
    rm -rf "$dir/loaded/run-$i-fault-logs"
    cp -r "$dir/test/fault-logs" "$dir/loaded/run-$i-fault-logs"
  fi
  for t in $fails; do failed_in[$t]="${failed_in[$t]:-}$i "; done
  summary+=("run $i: ${took} s, $( [ $rc = 0 ] && echo 'every test passed' || echo "failed: $fails")")
  echo "${summary[-1]}"
done
stop_load
load_pid=
echo "== $runs loaded run(s) of $dir, one core busy beside each"
printf '%s\n' "${summary[@]}"
if [ ${#failed_in[@]} -eq 0 ]; then
  echo "no test failed"
  exit 0
fi
for t in "${!failed_in[@]}"; do echo "$t failed in run(s) ${failed_in[$t]}"; done
exit 1

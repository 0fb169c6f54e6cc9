#!/usr/bin/env bash
# Live re-formation with one device (scripts/gpu_check.sh runs it on NCCL;
# it runs on the CPU backend anywhere): node A trains alone (--nnodes 1:2);
# node B joins with a worker that never forms the communicator (sleep), so
# A re-forms in place into a world of 2 whose communicator cannot be made;
# B is killed 3 s later: A gives up the communicator being made (NCCL:
# ncclCommAbort of a non-blocking init) and re-forms in place again, alone,
# and trains to the end with no step lost.
#   scripts/reform_check.sh BUILD OUTDIR LABEL PROGRAM ARGS...
# PROGRAM ARGS: A's worker command line (with --reform), e.g.
#   BUILD/examples/dp_train --steps 3000 --step-sleep-ms 5 --device --reform
set -uo pipefail
b=$1 out=$2 label=$3
shift 3
mkdir -p "$out"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$b/rendezvous/gpulaunch-rdzv" --listen "127.0.0.1:$port" >"$out/reform-$label-rdzv.log" 2>&1 &
rdzv=$!
common=(--nnodes 1:2 --nproc-per-node 1 --rdzv-backend gpulaunch --rdzv-endpoint "127.0.0.1:$port"
  --rdzv-id "reform-$label" --rdzv-conf "last_call_timeout=1,heartbeat_timeout=3" --max-restarts 0)
sleep 0.3
"$b/launcher/gpulaunch" "${common[@]}" "$@" >"$out/reform-$label-a.log" 2>&1 &
a=$!
alog=$out/reform-$label-a.log
for _ in $(seq 600); do # A trains alone (its workers may import a framework first)
  grep -q "first step in a world of 1" "$alog" && break
  kill -0 $a 2>/dev/null || break
  sleep 0.1
done
# B joins at once as a new node (no warm join: its worker, sleep, never says it re-forms in place)
setsid "$b/launcher/gpulaunch" "${common[@]}" --warm-start-timeout 0 --no-python sleep 600 \
  >"$out/reform-$label-b.log" 2>&1 &
bpid=$!
sleep 3
kill -9 -- -$bpid 2>/dev/null
wait $a
rc=$?
kill $rdzv 2>/dev/null
wait $rdzv 2>/dev/null
grep -E "is over|re-formed in place|restarting|first step in a world|rank 0 .*going on after" "$alog"
reforms=$(grep -c "workers re-formed in place" "$alog")
if [ $rc -eq 0 ] && [ "$reforms" -ge 1 ] && grep -q "round 2 is over" "$alog" &&
  ! grep -q "restarting workers" "$alog" &&
  grep -q "world 1, going on after step [0-9]* (0 lost" "$alog"; then
  echo "reform_check $label: PASS (exit 0; the world of 2 given up, re-formed alone in place, no restart, 0 lost)"
else
  echo "reform_check $label: FAILED (exit $rc, $reforms re-formations in place; logs in $out/reform-$label-*.log)"
  exit 1
fi

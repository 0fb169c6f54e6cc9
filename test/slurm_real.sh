#!/usr/bin/env bash
# A real Slurm on this machine, and a preempted job on it (test_slurm runs this).
#
# munged, slurmctld and two slurmd (nodes glslurm1 and glslurm2: Debian's
# Slurm runs several slurmd on one host with -N) start from a slurm.conf
# generated in a temporary directory, on free ports, inside a private mount
# namespace whose /etc/hosts names the two nodes (so that the first node of
# the nodelist, the master, resolves). Then:
#   1. srun gpulaunch --print-config: every option Slurm gives is "(slurm)";
#   2. two jobs of examples/slurm/train.sbatch, each `srun gpulaunch dp_train
#      ...` with no launcher option, share the two nodes (their rendezvous
#      ports come from their job ids): one runs to the end, the other gets
#      `scancel --signal=USR1` (what `#SBATCH --signal=USR1@90` sends before
#      the time limit) during training;
#   3. checks: both ranks saved the same step, and only it; gpulaunch exited
#      143 and the script requeued the job; the second run resumed from that
#      step and ended with parameters bitwise equal to the uninterrupted
#      job's (params_sha256 of every rank, and rank 0's dump).
# Slurm holds a requeued job until the credentials of its last run expire
# (AuthInfo's cred_expire, 120 s by default, then BeginTime): here 5 s. Once
# that time has passed, only the periodic scheduling pass starts it (an event
# such as another job ending starts a pass too, but only if it comes after):
# sched_interval 1 s here, where Slurm's default of 60 s outlasted the wait
# below when the reference job ended before the BeginTime.
# Every process started here lives in the mount namespace and is stopped on
# exit, whatever happened; the directory goes too.
#
# Usage: test/slurm_real.sh BUILD_DIR   (as root; exit 0 passed, 1 failed, 77 skipped)
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_real: SKIP: not root (slurmd and a mount namespace need root)"
    exit 77
fi
for b in slurmctld slurmd munged sbatch srun scontrol squeue scancel unshare; do
    if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
        echo "slurm_real: SKIP: $b is not installed (scripts/deps.sh installs slurmctld, slurmd, slurm-client, munge)"
        exit 77
    fi
done
if [ "${GL_SLURM_NS:-}" != 1 ]; then
    exec env GL_SLURM_NS=1 unshare --mount --propagation private -- "$0" "$@"
fi
export PATH=$PATH:/usr/sbin

B=$(cd "${1:?usage: slurm_real.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
GL=$B/launcher/gpulaunch
DP=$B/examples/dp_train
[ -x "$GL" ] && [ -x "$DP" ] || { echo "slurm_real: build gpulaunch and dp_train in $B first"; exit 1; }
# this test may itself run inside a Slurm job: nothing of that one leaks in
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset MASTER_ADDR MASTER_PORT PET_SLURM # (ctest sets PET_SLURM=off for every other test)

T0=$(date +%s.%N)
D=$(mktemp -d /tmp/gpulaunch-slurm.XXXXXX)
export SLURM_CONF=$D/slurm.conf
ok=0

elapsed() { echo "$(date +%s.%N) $T0" | awk '{printf "%.1f", $1 - $2}'; }
say() { echo "slurm_real [$(elapsed) s]: $*"; }
fail() {
    echo "slurm_real: FAIL: $*"
    exit 1
}

cleanup() {
    set +e
    if [ $ok != 1 ]; then
        for f in "$D"/*.out "$D"/slurmctld.log "$D"/slurmd-*.log; do
            [ -f "$f" ] || continue
            echo "---- $(basename "$f") (last 40 lines)"
            tail -n 40 "$f"
        done
    fi
    scancel --quiet --full $(squeue -h -o %i 2>/dev/null) 2>/dev/null
    # every process of this mount namespace but this shell: the daemons,
    # slurmstepd, the launchers and their workers
    local me mine pids=()
    me=$$
    mine=$(readlink /proc/$me/ns/mnt)
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = "$me" ] && continue
        [ "$(readlink /proc/"$p"/ns/mnt 2>/dev/null)" = "$mine" ] && pids+=("$p")
    done
    for p in "${pids[@]}"; do
        [ "$p" = "$BASHPID" ] || kill -TERM "$p" 2>/dev/null
    done
    sleep 1
    for p in "${pids[@]}"; do
        [ "$p" = "$BASHPID" ] || kill -KILL "$p" 2>/dev/null
    done
    umount /etc/hosts 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT

# ---- the cluster ----
port_free() { ! ss -Htln "sport = :$1" | grep -q .; }
base=0
for try in $(seq 1 50); do
    b=$((20000 + RANDOM % 10000))
    if port_free $b && port_free $((b + 1)) && port_free $((b + 2)); then
        base=$b
        break
    fi
done
[ $base != 0 ] || fail "no 3 free ports in 20000-30000"
first_job=$((1000 + RANDOM % 8000)) # rendezvous ports 15000 + job id % 10000

{ cat /etc/hosts; echo "127.0.0.1 glslurm1 glslurm2"; } >"$D/hosts"
mount --bind "$D/hosts" /etc/hosts

mkdir -m 700 "$D/munge"
mkdir -p "$D/state" "$D/spool"
head -c 1024 /dev/urandom >"$D/munge/key"
chmod 400 "$D/munge/key"
munged -f --socket="$D/munge/sock" --key-file="$D/munge/key" --pid-file="$D/munge/pid" \
    --log-file="$D/munge/log" --seed-file="$D/munge/seed" --num-threads=2 ||
    fail "munged did not start: $(tail -n 3 "$D/munge/log")"

cat >"$SLURM_CONF" <<EOF
ClusterName=gltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SlurmdParameters=config_overrides
FirstJobId=$first_job
JobRequeue=1
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=glslurm1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=2 State=UNKNOWN
NodeName=glslurm2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=2 State=UNKNOWN
PartitionName=gl Nodes=glslurm[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -f "$SLURM_CONF" -i || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" -N glslurm1 || fail "slurmd glslurm1 did not start"
slurmd -f "$SLURM_CONF" -N glslurm2 || fail "slurmd glslurm2 did not start"
for i in $(seq 1 100); do
    [ "$(sinfo -h -o '%D %t' 2>/dev/null)" = "2 idle" ] && break
    sleep 0.2
done
[ "$(sinfo -h -o '%D %t')" = "2 idle" ] || fail "the nodes did not come up idle: $(sinfo 2>&1)"
say "Slurm 22.05 cluster up: munged, slurmctld on port $base, slurmd glslurm1 and glslurm2"

# ---- 1. what gpulaunch takes from an srun step ----
srun -N2 --ntasks-per-node=1 --label "$GL" --print-config >"$D/print-config.out" 2>&1 ||
    fail "srun gpulaunch --print-config failed: $(cat "$D/print-config.out")"
job=$(sed -n 's/^0: rdzv-id *slurm-\([0-9]*\)\.0 .*/\1/p' "$D/print-config.out")
[ -n "$job" ] || fail "srun gpulaunch --print-config: no rdzv-id slurm-JOB.0: $(cat "$D/print-config.out")"
for want in "0: nnodes +2 +\(slurm\)" "1: nnodes +2 +\(slurm\)" "0: node-rank +0 +\(slurm\)" \
    "1: node-rank +1 +\(slurm\)" "1: master-addr +glslurm1 +\(slurm\)" \
    "1: master-port +$((15000 + job % 10000)) +\(slurm\)" "1: rdzv-id +slurm-$job\.0 +\(slurm\)"; do
    grep -Eq "^$want" "$D/print-config.out" ||
        fail "srun gpulaunch --print-config: no line matching '$want' in: $(cat "$D/print-config.out")"
done
say "srun gpulaunch --print-config: nnodes, node-rank, master-addr, master-port, rdzv-id from slurm"

# ---- 2. two jobs on the same two nodes; one is preempted ----
STEPS=400
submit() { # name -> job id
    GPULAUNCH=$GL sbatch --parsable --chdir="$D" --output="$D/$1.out" \
        "$SRC/examples/slurm/train.sbatch" "$DP" --steps $STEPS --step-sleep-ms 20 \
        --print-every 10 --checkpoint-dir "$D/ckpt-$1" --dump-params "$D/$1.params"
}
ref=$(submit ref) || fail "sbatch failed"
pre=$(submit pre) || fail "sbatch failed"
job_field() { scontrol show job "$1" 2>/dev/null | grep -oE "(^| )$2=[^ ]*" | head -n 1 | cut -d= -f2; }
wait_for() { # seconds, description, command...
    local until=$(($(date +%s) + $1)) what=$2
    shift 2
    until "$@"; do
        [ "$(date +%s)" -lt $until ] || fail "waited $(elapsed) s for $what"
        sleep 0.1
    done
}
has() { grep -q "$1" "$2" 2>/dev/null; }
started() { [ "$(grep -c "job slurm-$1.0 round 1: node rank" "$D/$2.out" 2>/dev/null)" = 2 ]; }
# the launchers' banners come at once (stderr); dp_train's step lines only
# when its stdout buffer fills: signal 2 s into training (steps of 20-40 ms)
wait_for 40 "job $pre's two launchers to start their workers" started "$pre" pre
sleep 2
t_sig=$(date +%s.%N)
scancel --signal=USR1 "$pre"
say "job $pre 2 s into training: scancel --signal=USR1 $pre"
wait_for 30 "job $pre's launchers to exit 143" has "preempted (exit 143): requeued" "$D/pre.out"
say "job $pre: srun exited 143 (seen $(echo "$(date +%s.%N) $t_sig" | awk '{printf "%.2f", $1 - $2}') s" \
    "after the scancel), the batch script requeued it"
state_is() { [ "$(job_field "$1" JobState)" = "$2" ]; }
wait_for 30 "job $pre to run again" has "job $pre run 2 on" "$D/pre.out"
say "job $pre: running again (run 2)"
wait_for 60 "job $ref to complete" state_is "$ref" COMPLETED
wait_for 60 "job $pre to complete" state_is "$pre" COMPLETED

# ---- 3. checks ----
out=$D/pre.out
[ "$(job_field "$pre" Restarts)" = 1 ] || fail "job $pre: Restarts=$(job_field "$pre" Restarts), not 1"
[ "$(job_field "$pre" ExitCode)" = 0:0 ] || fail "job $pre: ExitCode=$(job_field "$pre" ExitCode)"
[ "$(job_field "$ref" ExitCode)" = 0:0 ] || fail "job $ref: ExitCode=$(job_field "$ref" ExitCode)"
grep -q preempted "$D/ref.out" && fail "the uninterrupted job $ref was preempted too"
for r in 0 1; do
    [ "$(grep -c "job slurm-$pre.0 round 1: node rank $r of 2," "$out")" = 2 ] ||
        fail "not two runs of node rank $r in job slurm-$pre.0 (2 nodes, no launcher options)"
done
s0=$(sed -n 's/.*rank 0 preempted after step \([0-9]*\).*/\1/p' "$out")
s1=$(sed -n 's/.*rank 1 preempted after step \([0-9]*\).*/\1/p' "$out")
[ -n "$s0" ] && [ "$s0" = "$s1" ] || fail "ranks stopped after different steps: rank 0 '$s0', rank 1 '$s1'"
[ "$s0" -gt 0 ] && [ "$s0" -lt $STEPS ] || fail "preempted after step $s0, not between 1 and $STEPS-1"
dir=$D/ckpt-pre/$(printf 'step-%012d' "$s0")
[ -f "$dir/COMPLETE" ] || fail "no complete checkpoint of step $s0: $(ls -R "$D/ckpt-pre")"
[ -f "$dir/rank-0.manifest" ] && [ -f "$dir/rank-1.manifest" ] ||
    fail "step $s0 lacks a rank's manifest: $(ls "$dir")"
[ "$(ls "$D/ckpt-pre" | grep -c '^step-')" = 1 ] || fail "more than one checkpoint: $(ls "$D/ckpt-pre")"
grep -q "resumed from the checkpoint of step $s0" "$out" || fail "run 2 did not resume from step $s0"
for r in 0 1; do
    a=$(sed -n "s/.*rank $r params_sha256 \([0-9a-f]*\).*/\1/p" "$D/ref.out")
    b=$(sed -n "s/.*rank $r params_sha256 \([0-9a-f]*\).*/\1/p" "$out")
    [ -n "$a" ] && [ "$a" = "$b" ] ||
        fail "rank $r's parameters differ: uninterrupted '$a', preempted and resumed '$b'"
done
cmp -s "$D/ref.params" "$D/pre.params" || fail "rank 0's parameter dumps differ"
ms=$(sed -n 's/.*checkpoint of step [0-9]* written in \([0-9.]*\) s.*/\1/p' "$out" | head -n 1)
say "job $pre: ranks 0 and 1 checkpointed step $s0 ${ms:+(written in $ms s) }and exited 143;" \
    "requeued (Restarts=1), resumed from step $s0, parameters bitwise equal to job $ref's" \
    "($(sed -n 's/.*rank 0 params_sha256 \([0-9a-f]\{12\}\).*/\1/p' "$out")...)"
ok=1
say "ok"

#!/usr/bin/env bash
# One shot on the GPU machine (CUDA 13, NCCL from the nvidia-nccl-cu13 pip
# package, one GPU): builds with CUDA/NCCL against the dependencies carried in
# .gpudeps/ (scripts/gpu_prepare.sh), runs the NCCL tests, the example and the
# benchmarks, and writes everything to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
deps=$PWD/.gpudeps/root
export PKG_CONFIG_PATH="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CPATH="$deps/usr/include:$deps/usr/include/x86_64-linux-gnu"
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null ||
       python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
echo "NCCL from $nccl"
export LD_LIBRARY_PATH="$nccl/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
cmake -S . -B build/gpu -DGPULAUNCH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$nccl" \
  -DCUDAToolkit_ROOT=/usr/local/cuda -DCMAKE_PREFIX_PATH="$deps/usr" || exit 1
cmake --build build/gpu -j"$(nproc)" || exit 1
b=build/gpu
# The GPU health preflight is judged in its own step below (--gpu-health
# refuse); the other steps run whatever it finds, so that one finding does not
# hide every other result of this one-shot run.
export PET_GPU_HEALTH=${PET_GPU_HEALTH:-warn}
echo "== NCCL tests"
$b/test/test_nccl --verbose
echo "== runtime tests (CPU backend)"
$b/test/test_runtime --jobs 4 | tail -n 1
echo "== example on the NCCL backend"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/examples/dp_train --steps 50 --device
GPULAUNCH_BACKEND=cpu $b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/examples/dp_train --steps 50 | grep params_sha256
echo "== GPU health: preflight against the real NVML (clean expected), then the monitor's samples while dp_train --device runs"
# gl_nvml_abi.h declares NVML's ABI itself (the fake NVML of the tests shares it):
# checked here against NVIDIA's nvml.h before the driver is called with it
nvml_inc=$(dirname "$(ls /usr/local/cuda/include/nvml.h /usr/local/cuda/targets/*/include/nvml.h \
  /usr/include/nvml.h 2>/dev/null | head -n 1)")
if [ -f "$nvml_inc/nvml.h" ]; then
  cc -std=gnu11 -I launcher -I "$nvml_inc" test/nvml_abi_check.c -o "$b/nvml_abi_check" -ldl -lpthread &&
    "$b/nvml_abi_check" || echo "FAIL nvml_abi_check: gl_nvml.c does not match $nvml_inc/nvml.h"
else
  echo "nvml_abi_check skipped: no nvml.h (CUDA toolkit) on this machine"
fi
t0=$(date +%s%N)
$b/launcher/gpulaunch --standalone --check --gpu-health refuse
echo "gpulaunch --check: exit $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (NVML loaded and started)"
# its exit status too: the NVML thread may be inside the driver when the
# launcher exits; 130 (SIGINT, as asked) is right, 139 would be a crash at exit
{ GPULAUNCH_LOG_LEVEL=info timeout --preserve-status -s INT 15 \
  $b/launcher/gpulaunch --standalone --nproc-per-node 1 \
  --bind-gpus --gpu-monitor-interval 1 --metrics 127.0.0.1:9402 \
  $b/examples/dp_train --steps 1000000 --print-every 1000 --device 2>&1 |
  grep -E 'utilisation|GPU sample|XID|idle GPU|slowed|NVML|FAIL|warn GPU'
  echo "gpulaunch with the GPU monitor stopped by SIGINT: exit ${PIPESTATUS[0]} (130 expected)"; } &
sleep 8
curl -s 127.0.0.1:9402/metrics | grep '^gpulaunch_gpu' || echo "no /metrics answer"
wait
echo "== the PyTorch example on NCCL (train_ddp.py, 1 rank): resumed run bitwise equal to an uninterrupted one"
py=$(command -v python3)
ck=$(mktemp -d)
run_ddp() {
  PYTHONPATH=$PWD/python GPULAUNCH_LIBRARY=$b/runtime/libgpulaunch.so.0 \
    $b/launcher/gpulaunch --standalone --nproc-per-node 1 --no-python "$py" examples/train_ddp.py \
    --backend nccl "$@"
}
run_ddp --steps 40 | tee "$out/ddp-full.log" | grep -E 'params_sha256|step 39'
run_ddp --steps 20 --checkpoint-dir "$ck" --checkpoint-every 20 | grep params_sha256
run_ddp --steps 40 --checkpoint-dir "$ck" --checkpoint-every 20 | tee "$out/ddp-resumed.log" |
  grep -E 'resumed|params_sha256'
if [ "$(grep params_sha256 "$out/ddp-full.log")" = "$(grep params_sha256 "$out/ddp-resumed.log")" ]; then
  echo "train_ddp on NCCL: resumed run bitwise equal"
else
  echo "train_ddp on NCCL: FAILED: the resumed run differs"
fi
rm -rf "$ck"
echo "== FSDP2 on NCCL (train_fsdp.py, 1 rank): sharded state saved from the GPU (pinned staging, side stream), resumed run bitwise equal"
run_fsdp() {
  PYTHONPATH=$PWD/python GPULAUNCH_LIBRARY=$b/runtime/libgpulaunch.so.0 \
    $b/launcher/gpulaunch --standalone --nproc-per-node 1 --no-python "$py" examples/train_fsdp.py \
    --global-batch 8 --model small "$@"
}
ck=$(mktemp -d)
if "$py" -c 'from torch.distributed.fsdp import fully_shard' 2>/dev/null; then
  run_fsdp --steps 40 2>&1 | tee "$out/fsdp-full.log" | grep -E 'rank 0 params_sha256|steps in|Error'
  run_fsdp --steps 20 --checkpoint-dir "$ck" --checkpoint-every 10 2>&1 | grep -E 'checkpoint:|Error'
  run_fsdp --steps 40 --checkpoint-dir "$ck" 2>&1 | tee "$out/fsdp-resumed.log" |
    grep -E 'loaded into|rank 0 params_sha256|Error'
  if [ "$(grep 'rank 0 params_sha256' "$out/fsdp-full.log")" = \
       "$(grep 'rank 0 params_sha256' "$out/fsdp-resumed.log")" ]; then
    echo "train_fsdp on NCCL: resumed run bitwise equal"
  else
    echo "train_fsdp on NCCL: FAILED: the resumed run differs"
  fi
else
  echo "train_fsdp skipped: $("$py" -c 'import torch; print("torch", torch.__version__)') has no FSDP2 (torch >= 2.6)"
fi
rm -rf "$ck"
echo "== live re-formation on NCCL with one GPU (world 1): a node joins with a worker that never makes the communicator and is killed; the GPU rank gives up the communicator being made (ncclCommAbort of a non-blocking init, torch's abort) and re-forms alone in place"
scripts/reform_check.sh $b "$out" dp-nccl $b/examples/dp_train --steps 3000 --step-sleep-ms 5 --device --reform
PYTHONPATH=$PWD/python GPULAUNCH_LIBRARY=$b/runtime/libgpulaunch.so.0 \
  scripts/reform_check.sh $b "$out" ddp-nccl --no-python "$py" examples/train_ddp.py --backend nccl \
  --reform --steps 300 --step-sleep-ms 20
if "$py" -c 'from torch.distributed.fsdp import fully_shard' 2>/dev/null; then
  # ShardedElastic on NCCL: the agreement, the copy of its shards (device tensors) and the
  # all-reduce that ends it, each on the GPU's communicator
  PYTHONPATH=$PWD/python GPULAUNCH_LIBRARY=$b/runtime/libgpulaunch.so.0 \
    scripts/reform_check.sh $b "$out" fsdp-nccl --no-python "$py" examples/train_fsdp.py \
    --reform --steps 300 --step-sleep-ms 20
fi
echo "== checkpoints of CUDA tensors: save_state through pinned staging on a side stream, loaded back bitwise"
PYTHONPATH=$PWD/python GPULAUNCH_LIBRARY=$b/runtime/libgpulaunch.so.0 \
  "$py" -m pytest -q -rs -p no:cacheprovider test/python/test_checkpoint_async.py -k cuda
echo "== allreduce_bench, NCCL"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/test/bench/allreduce_bench \
  --backend nccl -b 1M -e 1G -f 4 -n 50 -w 10 -c 1
echo "== ResNet-50 gradient sync, NCCL"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/test/bench/allreduce_bench \
  --backend nccl --dp-resnet50 -n 20
echo "== done"

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
  -DCUDAToolkit_ROOT=/usr/local/cuda || exit 1
cmake --build build/gpu -j"$(nproc)" || exit 1
b=build/gpu
echo "== NCCL tests"
$b/test/test_nccl --verbose
echo "== runtime tests (CPU backend)"
$b/test/test_runtime --jobs 4 | tail -n 1
echo "== example on the NCCL backend"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/examples/dp_train --steps 50 --device
GPULAUNCH_BACKEND=cpu $b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/examples/dp_train --steps 50 | grep params_sha256
echo "== allreduce_bench, NCCL"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/test/bench/allreduce_bench \
  --backend nccl -b 1M -e 1G -f 4 -n 50 -w 10 -c 1
echo "== ResNet-50 gradient sync, NCCL"
$b/launcher/gpulaunch --standalone --nproc-per-node 1 $b/test/bench/allreduce_bench \
  --backend nccl --dp-resnet50 -n 20
echo "== done"

#!/usr/bin/env bash
# The checkpoint comparison of docs/performance.md, in one run:
#   1. C (ckpt_bench, 2 ranks): the stall of one checkpoint for gpulaunch's
#      asynchronous and synchronous saves against a memcpy of the same bytes,
#      and steps per second with a checkpoint every N steps against none, for
#      each state size;
#   2. PyTorch (ckpt_bench_torch.py, 2 ranks, ~1 GiB of model and Adam state a
#      rank): torch.save, DCP save and async_save (thread, process), gpulaunch
#      sync and async, memcpy; then steps per second;
#   3. S3 (moto's server on this machine): the checkpoints' client uploading a
#      file of the first size against one `curl -T` of it.
# usage: test/bench/ckpt_bench.sh BUILD_DIR [DIR] [SIZES_MIB] [EVERY] [STEPS]
#   (defaults: /var/tmp/gpl-ckpt-bench, "1024 3072", 150, 300; the short
#   version CI could run: "64" 10 30)
set -euo pipefail
build=$(realpath "$1")
dir=${2:-/var/tmp/gpl-ckpt-bench}
sizes=${3:-1024 3072}
every=${4:-150}
steps=${5:-300}
src=$(cd "$(dirname "$0")/../.." && pwd)
gl=$build/launcher/gpulaunch
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

echo "== C: 2 ranks, a step of 100 ms (sleep), a checkpoint every $every steps, $steps steps"
for mib in $sizes; do
  for mode in none async sync; do
    rm -rf "$dir/c"
    "$gl" --standalone --nproc-per-node 2 "$build/test/bench/ckpt_bench" --state-mib "$mib" \
      --mode "$mode" --every "$every" --steps "$steps" --step-ms 100 --dir "$dir/c" 2>&1 |
      grep -o 'ckpt_bench mode=.*' || echo "ckpt_bench $mode $mib MiB: failed"
  done
done

torch2=$("$src/scripts/torch2.sh" 2>/dev/null | tail -n 1 || true)
if [ -x "$torch2" ]; then
  echo "== PyTorch: $("$torch2" -c 'import torch; print("torch", torch.__version__)'), 2 ranks"
  PYTHONPATH=$src/python GPULAUNCH_LIBRARY=$build/runtime/libgpulaunch.so.0 \
    "$gl" --standalone --nproc-per-node 2 --no-python "$torch2" "$src/test/bench/ckpt_bench_torch.py" \
    --dir "$dir/torch" --every "$every" --steps "$steps" 2>&1 | grep -o 'ckpt_bench_torch.*' || true
else
  echo "== PyTorch: no torch 2 environment (scripts/torch2.sh)"
fi

s3py=$("$src/scripts/s3server.sh" 2>/dev/null | tail -n 1 || true)
if [ -x "$s3py" ]; then
  mib=${sizes%% *}
  echo "== S3: $mib MiB to moto's server on this machine"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$s3py" -m moto.server -p "$port" >"$dir/moto.log" 2>&1 &
  moto=$!
  trap 'kill $moto 2>/dev/null; rm -rf "$dir"' EXIT
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/moto-api/" >/dev/null && break; sleep 0.1; done
  "$s3py" "$src/test/s3_proxy.py" setup --moto "http://127.0.0.1:$port" --bucket bench --no-enforce >/dev/null
  head -c $((mib << 20)) /dev/urandom >"$dir/file"
  export GPULAUNCH_S3_ENDPOINT=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench \
    AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
  t0=$(date +%s.%N)
  curl -sf -T "$dir/file" --aws-sigv4 "aws:amz:us-east-1:s3" --user bench:bench \
    -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "http://127.0.0.1:$port/bench/curl-single" >/dev/null
  t1=$(date +%s.%N)
  echo "curl -T (one PUT): $(echo "$mib $t0 $t1" | awk '{printf "%.3f s, %.1f MB/s", $3-$2, $1*1.048576/($3-$2)}')"
  # multipart (the parts, then the server's assembly of them, from the debug log)
  GPULAUNCH_LOG_LEVEL=debug "$build/test/bench/s3_bench" s3://bench/job "$dir/file" 2>&1 |
    grep -oE "[0-9]+ parts in [0-9]+ ms, completed in [0-9]+ ms|s3_bench .*"
  # the client's single PUT of the same file
  GPULAUNCH_S3_PART_BYTES=5g "$build/test/bench/s3_bench" s3://bench/single "$dir/file" |
    sed 's/^s3_bench/s3_bench (one PUT)/'
fi

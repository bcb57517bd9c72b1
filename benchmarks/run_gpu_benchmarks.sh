#!/usr/bin/env bash
# Runs the GPU benchmark set on one host with 2 GPUs in about ten minutes, each
# step under its own time limit so that one failure does not stop the rest.
# Usage: benchmarks/run_gpu_benchmarks.sh OUT_DIR
# GPU 1 runs the GPU tests, storage tiers and the checkpoint benchmark while the
# CPUs generate data and measure the input pipeline; then GPU 0 trains both
# example configs, then both GPUs train the dynamicemb config.
set -u
out=${1:?usage: run_gpu_benchmarks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
data=/tmp/hashrec_bench_data
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout "$limit" "$@"; echo "=== $name exit $? $(date -u +%H:%M:%S)"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1
(
  CUDA_VISIBLE_DEVICES=1 step gpu_tests 120 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/table tests/embedding
  CUDA_VISIBLE_DEVICES=1 step storage_tiers 150 python3 benchmarks/bench_storage_tiers.py \
      --out "$out/storage_tiers_gpu"
  CUDA_VISIBLE_DEVICES=1 step checkpoint 120 python3 benchmarks/bench_checkpoint.py --gb 10 \
      --device cuda --dir /tmp/hashrec_ckpt_bench --out "$out/checkpoint_gpu.json"
) > "$out/gpu1.log" 2>&1 &
gpu1=$!
{
  step gen_data 80 python3 -m hashrec.tools.gen_taobao_data --output_dir "$data" \
      --num_rows 1000000 --num_files 16 --quiet
  step bench_data 70 python3 benchmarks/bench_data.py --data "$data" --workers 0,4,8,16 \
      --json "$out/data_gpu_host.json" --markdown "$out/data_gpu_host.md"
  CUDA_VISIBLE_DEVICES=0 step train_1gpu 200 python3 benchmarks/bench_train.py \
      --data_dir "$data" --out_dir "$out"
  wait $gpu1
  step train_2gpu 170 python3 benchmarks/bench_train.py --nproc 2 --configs dynamicemb \
      --data_dir "$data" --out_dir "$out"
} > "$out/main.log" 2>&1
wait

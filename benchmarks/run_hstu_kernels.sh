#!/usr/bin/env bash
# Runs the checks and measurements of the HSTU attention kernels on one GPU, each step
# under its own time limit (ONLY="name ..." / SKIP="name ..." pick steps). About 13
# minutes on a fresh H100 host (op_tests 40 s, model_tests 80 s, bench with the sweep's
# compiles about two minutes, ab_dlrm_hstu 270 s, ab_hstu_match about 300 s): more than one
# device call of ten minutes takes, so run it as two (SKIP="ab_hstu_match", then
# ONLY="ab_hstu_match").
# Usage: benchmarks/run_hstu_kernels.sh OUT_DIR
# Steps:
#   op_tests     the kernels against the reference on CUDA (float32, float16, bfloat16,
#                more rows x heads than a grid axis takes, a CUDA graph's replay, an STU
#                layer with the kernels on and off under BF16 autocast)
#   model_tests  the gpu-marked HSTU, STU and dlrm_hstu tests with the kernels on
#                (HASHREC_HSTU_KERNELS=1): the models trained graphed like eager among them
#   bench        bench_hstu_attention.py --sweep: the op, an STU layer and an HSTU block,
#                kernels against reference, and the kernels' tile sides and warps
#   ab_dlrm_hstu bench_train's dlrm_hstu pair, kernels off against on (ab_train.py, one
#                round; data in /tmp/hashrec_bench_data)
#   ab_hstu_match the same for hstu_match
set -u
out=${1:?usage: run_hstu_kernels.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
data=/tmp/hashrec_bench_data
trees=".+HASHREC_HSTU_KERNELS=0,.+HASHREC_HSTU_KERNELS=1"
source "$(dirname "$0")/_steps.sh"
write_env "$out"
{
  step op_tests 90 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
      tests/modules/test_hstu_attention.py
  HASHREC_HSTU_KERNELS=1 step model_tests 180 python3 -m pytest -q -p no:cacheprovider -m gpu \
      -k "hstu or stu or dlrm" tests -n 6 --dist loadfile
  step bench 240 python3 benchmarks/bench_hstu_attention.py --sweep \
      --out "$out/hstu_attention_gpu"
  step ab_dlrm_hstu 300 python3 benchmarks/ab_train.py --trees "$trees" --configs dlrm_hstu \
      --rounds 1 --num_steps 200 --warmup_steps 60 --data_dir "$data" \
      --out "$out/ab_gpu_hstu_kernels_dlrm_hstu"
  step ab_hstu_match 300 python3 benchmarks/ab_train.py --trees "$trees" --configs hstu_match \
      --rounds 1 --num_rows 600000 --num_steps 300 --warmup_steps 100 --data_dir "$data" \
      --out "$out/ab_gpu_hstu_kernels_hstu_match"
} 2>&1 | tee "$out/run_hstu_kernels.log"

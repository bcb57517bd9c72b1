#!/usr/bin/env bash
# Runs the training-side GPU benchmarks on one host with 2 GPUs (about ten minutes
# for all of them; SKIP some to fit a shorter call), one step after the other (so that the loader's CPUs and the GPUs are
# not shared between measurements), each under its own time limit so that one
# failure does not stop the rest.
# Usage: benchmarks/run_gpu_benchmarks.sh OUT_DIR
# Steps: the GPU tests (tables, embedding, distributed, training, data); generated data; both
# example configs on 1 GPU, then on 2 GPUs (STEPS steps, default 1000; steady
# state: the table growth and admission warm-up of the first WARMUP, default 400,
# are left out); dynamicemb on 1 and 2 GPUs in three interleaved rounds
# (bench_scaling.py, scaling_gpu_x2.md); the host syncs per
# step; kernel-level profiles of both configs' steps (1 GPU, then each rank of 2); a
# dynamic table's training lookup kernel by kernel; the embedding-layer benchmark;
# the input pipeline. On a fresh host the first training run also compiles the
# Triton kernels (about two minutes; cached after). SKIP="name ..." leaves steps out,
# ONLY="name ..." runs just those (step names: the lines "=== NAME" in main.log).
# AB_TREES="TREE_A,TREE_B" adds an interleaved A/B of those source trees (a tree may
# carry settings: ".+HASHREC_LOOKUP_GRAPHS=0,.")
# (benchmarks/ab_train.py; AB_CONFIGS, default dynamicemb; AB_NPROC GPUs, default 1).
# The 2-GPU profiles are followed by each collective's wait for the last rank
# (collective_skew.py). The host time per function of both configs' steps on 1 GPU, and
# of dynamicemb's on each rank of 2 (host_split.py), follows the profiles, then the 1-GPU
# and rank 0's side by side (host_split_diff.py).
set -u
out=${1:?usage: run_gpu_benchmarks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
data=/tmp/hashrec_bench_data
steps=${STEPS:-1000}
warmup=${WARMUP:-400}
source "$(dirname "$0")/_steps.sh"
write_env "$out"
{
  step gpu_tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/table tests/embedding tests/distributed \
      tests/train tests/data
  step gen_data 80 python3 -m hashrec.tools.gen_taobao_data --output_dir "$data" \
      --num_rows 1000000 --num_files 16 --sequence_format "${SEQUENCE_FORMAT:-list}" --quiet
  CUDA_VISIBLE_DEVICES=0 step train_1gpu 300 python3 benchmarks/bench_train.py \
      --data_dir "$data" --num_rows 1000000 --num_steps "$steps" --warmup_steps "$warmup" \
      --out_dir "$out"
  step train_2gpu 200 python3 benchmarks/bench_train.py --nproc 2 --data_dir "$data" \
      --num_rows 1000000 --num_steps "$steps" --warmup_steps "$warmup" --out_dir "$out"
  # 1 then 2 GPUs, three rounds interleaved (their bench_train files in scaling/).
  step scaling 330 python3 benchmarks/bench_scaling.py --nproc 2 --rounds 3 --data_dir "$data" \
      --num_rows 1000000 --num_steps 600 --warmup_steps 300 --out_dir "$out/scaling"
  if [ -n "${AB_TREES:-}" ]; then  # e.g. AB_TREES=.ab/REV,. (benchmarks/ab_tree.sh REV)
    nproc=${AB_NPROC:-1}
    devices=0; [ "$nproc" -gt 1 ] && devices=$(seq -s, 0 $((nproc - 1)))
    CUDA_VISIBLE_DEVICES=$devices step ab_${nproc}gpu 300 python3 benchmarks/ab_train.py \
        --trees "$AB_TREES" --configs "${AB_CONFIGS:-dynamicemb}" --nproc "$nproc" \
        --data_dir "$data" --num_steps 700 --warmup_steps "$warmup" --out "$out/ab_gpu"
  fi
  CUDA_VISIBLE_DEVICES=0 step audit_syncs 60 python3 benchmarks/audit_syncs.py --data "$data" \
      --config dynamicemb --warmup 200 --out "$out/syncs_gpu_dynamicemb"
  for config in dynamicemb num_buckets; do
    CUDA_VISIBLE_DEVICES=0 step "profile_$config" 90 python3 benchmarks/profile_train_step.py \
        --data "$data" --config "$config" --warmup "$warmup" --steps 10 --sample_steps 100 --trace \
        --out "$out/profile_train_gpu_$config"
  done
  for config in dynamicemb num_buckets; do  # rank files: profile_train_gpu_x2_CONFIG.rankR.*
    step "profile_x2_$config" 120 torchrun --nproc_per_node 2 benchmarks/profile_train_step.py \
        --data "$data" --config "$config" --warmup 300 --steps 10 --sample_steps 100 --trace \
        --out "$out/profile_train_gpu_x2_$config"
    step "collective_skew_$config" 60 python3 benchmarks/collective_skew.py \
        --traces "$out/profile_train_gpu_x2_$config" --steps 10 \
        --out "$out/collective_skew_gpu_x2_$config"
    rm -f "$out/profile_train_gpu_x2_$config".rank*.trace.json.gz
  done
  for config in dynamicemb num_buckets; do
    CUDA_VISIBLE_DEVICES=0 step "host_split_$config" 90 python3 benchmarks/host_split.py \
        --data "$data" --config "$config" --warmup "$warmup" --steps 200 \
        --out "$out/host_split_gpu_$config"
  done
  step host_split_x2 120 torchrun --nproc_per_node 2 benchmarks/host_split.py --data "$data" \
      --config dynamicemb --warmup 300 --steps 200 --out "$out/host_split_gpu_x2_dynamicemb"
  step host_split_diff 30 python3 benchmarks/host_split_diff.py \
      "$out/host_split_gpu_dynamicemb.json" "$out/host_split_gpu_x2_dynamicemb.rank0.json" \
      --out "$out/host_split_gpu_x1_vs_x2_dynamicemb"
  CUDA_VISIBLE_DEVICES=0 step lookup_kernels 90 python3 benchmarks/profile_lookup_gpu.py \
      --out "$out/lookup_kernels_gpu"
  CUDA_VISIBLE_DEVICES=0 step embedding_layer 90 python3 benchmarks/bench_embedding_layer.py \
      --out "$out/embedding_layer_gpu"
  step bench_data 60 python3 benchmarks/bench_data.py --data "$data" --workers 0,8,12 \
      --json "$out/data_gpu_host.json" --markdown "$out/data_gpu_host.md"
} > "$out/main.log" 2>&1

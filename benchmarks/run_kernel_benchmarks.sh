#!/usr/bin/env bash
# Runs the table-kernel GPU benchmarks on one GPU, one step after the other, each under
# its own time limit so that one failure does not stop the rest. About 30 minutes in
# all on a fresh host (every kernel variant compiles first); ONLY="name ..." runs just
# those steps, SKIP="name ..." leaves steps out, to fit the calls into shorter ones.
# Usage: benchmarks/run_kernel_benchmarks.sh OUT_DIR
# Steps:
#   gpu_tests      the compiled table-op comparisons against the reference (large sizes)
#   gpu_layer_tests the embedding kernels (pooling, reduction, dedup, gradient rows, counts),
#                  joins, emit, rows by slot, captured lookups and their kernels compiled on the GPU
#                  (the suites that run interpreted on CPU-only hosts, and gpu-marked ones)
#   upsert_sweep   insert_or_assign per insert-program launch: one program per sorted
#                  position against the block form (UPSERT_BLOCK), at three load factors
#   find_sweep     find_values at launch configs (keys a program, warps, register cap, the
#                  probe by word), each launch timed back to back, at dims 8 to 128
#   table_ops      HierarchicalKV's setup (bench_table_gpu.py) with BLOCK (default 32, the
#                  library's) positions per insert program, every insert call from the filled
#                  index; then profile_upsert_evict.py (runs needing eviction, the block
#                  kernel alone with eviction on and off)
#   table_api      the public HashTable calls (find, find_or_insert, insert_or_assign) between
#                  syncs and in a loop, each profiled (profile_table_api.py)
#   rehash         table growth: the Triton rehash against the reference's (bench_rehash.py)
#   admission      the admission counters' find and count by the probe's form
#                  (bench_admission.py), then the count with the upsert's lane form placing
#                  runs of up to 4 and of up to 32 misses in their 1,024-slot buckets
#                  (--wide-lane-width), alternating, two rounds
#   embedding      the embedding-layer benchmark (the fused kernels and EmbeddingCollection),
#                  with the backward's tiles swept (device time and one call), the
#                  layer's kernels profiled by launching operator, and every kernel of its
#                  forward with the next dedup ahead (--trace)
#   rows_sweep     the layer's row kernels alone (sweep_rows_gpu.py: the lookup's finish,
#                  pooling from unique rows and from the table, the sequence gather, the
#                  optimizer update) at launch configs, bags and sequences of 8 ids
#   upsert_regs    bench_table_gpu.py at dims 8 and 128 with the block form's registers
#                  capped at 128, then 96 (it takes 168 uncapped: 17-19% occupancy)
#   lanes_table    bench_table_gpu.py with the upsert's lane form off (HASHREC_UPSERT_LANES=0;
#                  the table_ops step is the default: on for calls of 131,072 keys or more)
#   mask_probe     bench_table_gpu.py with the probes' matches from a tile of digest words
#                  (HASHREC_MASK_PROBE=0; the table_ops step is the default: from bit masks in
#                  buckets up to 128 slots), then the compiled table-op comparisons with it
#   word_probe     with the tile (HASHREC_MASK_PROBE=0): bench_table_gpu.py with every probe
#                  by position (HASHREC_WORD_PROBE=0), then with three lowest digest matches by
#                  word (HASHREC_WORD_PROBE_LOWEST=3; two by default), then the compiled
#                  table-op comparisons (gpu_tests) with three
#   ab_train       the training run on 1,000,000 generated rows (made when missing, in
#                  /tmp/hashrec_bench_data), ROUNDS (default 2) interleaved rounds of the
#                  trees AB_TREES (ab_train.py --trees; make an older tree with
#                  benchmarks/ab_tree.sh REV and carry .ab), into OUT/AB_NAME; by default
#                  this tree against itself with the upsert's lane form off
#                  (HASHREC_UPSERT_LANES=0), and on for calls of every size
#   lanes_profile  the dynamicemb training step's kernels with the lane form on for calls of
#                  every size, then off (needs ab_train's data)
set -u
out=${1:?usage: run_kernel_benchmarks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
block=${BLOCK:-32}
data=/tmp/hashrec_bench_data
source "$(dirname "$0")/_steps.sh"
write_env "$out"
{
  step gpu_tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/table/test_triton_table_ops.py tests/table/test_triton_upsert.py \
      tests/table/test_upsert_rows.py
  step gpu_layer_tests 560 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
      tests/embedding/test_triton_embedding_ops.py tests/embedding/test_collection_joins.py \
      tests/embedding/test_collection_gpu.py tests/embedding/test_collection_table_rows.py \
      tests/embedding/test_dedup_ops.py tests/embedding/test_dedup_graphs.py \
      tests/embedding/test_stats.py tests/embedding/test_positions.py tests/embedding/test_emit.py \
      tests/table/test_lookup_graphs.py tests/table/test_fixed_lookup.py tests/table/test_dedup.py
  step upsert_sweep 330 python3 benchmarks/profile_upsert_gpu.py --load-factors 0.5 0.75 1.0 \
      --reps 5 --runs 1 --warps 1 4 --block 0 32 64 --width 2 4 \
      --out "$out/upsert_launch_gpu"
  step find_sweep 200 python3 benchmarks/sweep_find_gpu.py --dims 8 32 64 128 \
      --configs 32x1r80w 32x1r72w 16x1r80w 16x1w 32x1w 64x4 \
      --kinds words --reps 5 --out "$out/find_sweep_gpu"
  step table_ops 300 python3 benchmarks/bench_table_gpu.py --reps 5 --upsert-block "$block" \
      --out "$out/table_gpu"
  step table_ops 200 python3 benchmarks/profile_upsert_evict.py --out "$out/upsert_evict_gpu"
  for regs in 128 96; do
    step upsert_regs 150 python3 benchmarks/bench_table_gpu.py --reps 5 --dims 8 128 \
        --upsert-maxnreg "$regs" --out "$out/table_gpu_upsert_maxnreg$regs"
  done
  step lanes_table 300 python3 benchmarks/bench_table_gpu.py --reps 5 --upsert-lanes 0 \
      --profile --out "$out/table_gpu_lanes_off"
  step mask_probe 300 env HASHREC_MASK_PROBE=0 python3 benchmarks/bench_table_gpu.py \
      --reps 5 --out "$out/table_gpu_tile"
  step mask_probe 300 env HASHREC_MASK_PROBE=0 python3 -m pytest -m gpu -q \
      -p no:cacheprovider tests/table/test_triton_table_ops.py tests/table/test_triton_upsert.py
  step word_probe 300 env HASHREC_MASK_PROBE=0 python3 benchmarks/bench_table_gpu.py \
      --reps 5 --word-probe 0 --out "$out/table_gpu_by_position"
  step word_probe 300 env HASHREC_MASK_PROBE=0 python3 benchmarks/bench_table_gpu.py \
      --reps 5 --word-probe-lowest 3 --out "$out/table_gpu_probe_lowest3"
  step word_probe 300 env HASHREC_MASK_PROBE=0 HASHREC_WORD_PROBE_LOWEST=3 python3 -m pytest \
      -m gpu -q -p no:cacheprovider tests/table/test_triton_table_ops.py \
      tests/table/test_triton_upsert.py
  step table_api 200 python3 benchmarks/profile_table_api.py --dims 32 128 \
      --out "$out/table_api_gpu"
  step rehash 200 python3 benchmarks/bench_rehash.py --out "$out/rehash_gpu"
  step admission 200 python3 benchmarks/bench_admission.py --out "$out/admission_gpu"
  for round in 1 2; do
    for width in 4 32; do
      step admission 150 python3 benchmarks/bench_admission.py --load-factors 0.5 0.75 \
          --rounds 1 --wide-lane-width $width --out "$out/admission_lanes${width}_${round}"
    done
  done
  step embedding 200 python3 benchmarks/bench_embedding_layer.py \
      --reduce-configs 2048x4 8192x1 4096x2 r16x1 r64x1 --profile --trace \
      --out "$out/embedding_layer_gpu"
  step rows_sweep 120 python3 benchmarks/sweep_rows_gpu.py --pool-configs 4x1 8x2 16x4 \
      --gather-configs 4x2 16x4 --bag-length 8 --out "$out/sweep_rows_gpu_bag8"
  lane_trees=".,.+HASHREC_UPSERT_LANES=0,.+HASHREC_UPSERT_LANES_MIN=0"
  step ab_train 570 python3 benchmarks/ab_train.py --trees "${AB_TREES:-$lane_trees}" \
      --configs dynamicemb --nproc 1 --rounds "${ROUNDS:-2}" --data_dir "$data" \
      --num_steps 700 --warmup_steps 400 --out "$out/${AB_NAME:-ab_gpu_x1_upsert_lanes_min}"
  for lanes in 1 0; do  # after ab_train, which makes the data
    step lanes_profile 150 env HASHREC_UPSERT_LANES=$lanes HASHREC_UPSERT_LANES_MIN=0 \
        python3 benchmarks/profile_train_step.py --data "$data" --config dynamicemb \
        --warmup 300 --steps 10 --out "$out/profile_train_gpu_dynamicemb_lanes$lanes"
  done
} > "$out/main.log" 2>&1

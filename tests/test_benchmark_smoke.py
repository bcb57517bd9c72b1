"""The quick GPU benchmark scripts run end to end at ``--smoke`` sizes (the Triton kernels
interpreted on the CPU), so a change of the library's API does not leave them broken until
the next GPU run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="smoke sizes are for CPU-only hosts")


def _smoke(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--smoke", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_sweep_rows_runs_every_kernel_under_each_config():
    out = _smoke("sweep_rows_gpu.py", "--optimizer", "adam", "--bag-length", "3",
                 "--finish-configs", "1024x2", "--pool-configs", "4x1",
                 "--gather-configs", "4x2", "--apply-configs", "2x1")
    for row in ("| finish | 1024x2 |", "| pool_rows | 4x1 |", "| pool_table | 4x1 |",
                "| gather | 4x2 |", "| apply | 2x1 |", "| apply | default |"):
        assert row in out, row


def test_embedding_layer_benchmark_runs():
    out = _smoke("bench_embedding_layer.py", "--reduce-configs", "1024x2",
                 "--data-types", "float16")
    assert "Layer forward with the next batch's deduplication started ahead" in out
    assert "| 1024x2 |" in out  # the backward timed at another tile
    assert "| float32 |" in out and "| float16 |" in out  # the layer by table type


def test_table_floor_benchmark_runs():
    out = _smoke("bench_table_floor.py")
    assert "| dim | rows floor ms (TB/s) |" in out
    assert "Parts (ms): probe_lines " in out


def test_table_api_profile_runs_the_triton_path():
    out = _smoke("profile_table_api.py")
    for op in ("find", "find_or_insert", "insert_or_assign"):
        assert f"| 8 | {op} |" in out, op


def test_rehash_benchmark_compares_the_two_ops():
    out = _smoke("bench_rehash.py")
    assert "'same': True" in out


def test_admission_benchmark_compares_the_probe_forms():
    out = _smoke("bench_admission.py", "--out", str(ROOT / "build" / "admission_smoke"))
    assert out.count("'same': True") == 2 and out.count("'reference': True") == 2
    table = (ROOT / "build" / "admission_smoke.md").read_text()
    assert "| 1.00 | count |" in table


def test_fused_insert_bound_holds_its_checks(tmp_path):
    out = _smoke("proto_upsert_fused.py", "--out", str(tmp_path / "bound"))
    assert "| 0.5 | 8 |" in out and "all hold; 0 keys left out |" in out
    assert (tmp_path / "bound.json").exists()


def test_hitrate_benchmark_times_each_way(tmp_path):
    out = _smoke("bench_hitrate.py", "--out", str(tmp_path / "hitrate"))
    for way in ("| chunked |", "| one_chunk |", "| masked_amax |", "| matmul_only |"):
        assert way in out, way
    assert set(json.loads((tmp_path / "hitrate.json").read_text())["ways"]) == {
        "chunked", "one_chunk", "masked_amax", "matmul_only"}


def test_dropout_benchmark_times_both_ways_alone_and_in_a_layer(tmp_path):
    out = _smoke("bench_dropout.py", "--out", str(tmp_path / "dropout"))
    result = json.loads((tmp_path / "dropout.json").read_text())
    assert set(result["median_ms"]) == {"op_torch", "op_hashrec", "stu_layer_torch",
                                        "stu_layer_hashrec"}
    assert all(ms > 0 for ms in result["median_ms"].values())
    assert "| STU layer" in out and "| dropout of" in out


def test_stu_ops_benchmark_times_each_part(tmp_path):
    out = _smoke("bench_stu_ops.py", "--out", str(tmp_path / "stu"))
    result = json.loads((tmp_path / "stu.json").read_text())
    for part in ("group_norm", "layer_norm_affine", "index_one_row", "embedding_one_row",
                 "stu_layer", "positional_encoder"):
        assert f"| {part} |" in out, part
        assert result[f"{part}_ms"] > 0, part
    # the two norms are one computation
    assert result["max_abs_difference"] < 1e-4


def test_hstu_attention_benchmark_times_both_ways(tmp_path):
    out = _smoke("bench_hstu_attention.py", "--sweep", "--sweep_sides", "16",
                 "--out", str(tmp_path / "attention"))
    result = json.loads((tmp_path / "attention.json").read_text())
    for part in ("attention", "stu_layer", "hstu_block"):
        assert f"| {part} |" in out, part
        assert result[f"{part}_reference_ms"] > 0 and result[f"{part}_triton_ms"] > 0, part
    for name in ("forward", "keys_values", "queries"):  # two warp counts at tile side 16
        assert len(result["sweep"][name]) == 2 and f"| {name} |" in out, name
    assert result["sweep_best_ms"] > 0
    # the interpreted kernels under FP16 autocast stay within half precision of the reference
    assert all(result[f"{name}_relative_difference"] < 3e-2 for name in ("out", "dq", "dk", "dv"))


def test_hstu_kernel_registers_reports_each_kernel(tmp_path):
    """Compiled for sm_90 ahead of time (not interpreted): ptxas's registers a thread."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "benchmarks/hstu_kernel_registers.py",
                           "--settings", "16/32/4", "--out", str(tmp_path / "registers")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "registers.json").read_text())
    (row,) = result["rows"]
    assert row["setting"] == [16, 32, 4] and "| 16 | 32 | 4 |" in done.stdout
    for kernel in ("forward", "keys_values", "queries"):
        assert 0 < row[kernel]["registers"] <= 255, kernel
        assert row[kernel]["spill_stores"] >= 0 and row[kernel]["spill_loads"] >= 0
        assert 0 < row[kernel]["resident_warps"] <= 64, kernel
    assert result["picks"] == {k: [16, 32, 4] for k in ("forward", "keys_values", "queries")}

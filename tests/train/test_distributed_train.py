"""torchrun smoke test: train_eval and eval on 2 CPU ranks (gloo) on tiny generated data.

The row counts are odd so the ranks' shares differ by one row: training stops
every rank together, and evaluation still covers every eval row (the rank that
runs out first serves its peer's lookups).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys

import pytest

from hashrec.tools.gen_taobao_data import generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")
EVAL_ROWS = 301

pytestmark = pytest.mark.slow

EDITS = {
    "data_config.batch_size": 100,
    "data_config.num_workers": 0,
    "train_config.num_epochs": 1,
    "train_config.log_step_count_steps": 2,
    "feature_configs[sequence_name=click_50_seq].sequence_feature.sequence_length": 5,
    "model_config.multi_tower_din.towers[0].mlp.hidden_units": [8],
    "model_config.multi_tower_din.din_towers[0].attn_mlp.hidden_units": [4],
    "model_config.multi_tower_din.final.hidden_units": [4],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", module,
           *args, "--edit_config_json", json.dumps(EDITS)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_torchrun_train_eval_writes_per_rank_shards_and_one_result(tmp_path):
    data = tmp_path / "data"
    generate(str(data), 801, seed=5, scale=0.001, eval_rows=EVAL_ROWS, quiet=True)
    model_dir = tmp_path / "model"
    run = torchrun("hashrec.train_eval", "--pipeline_config_path", CONFIG,
                   "--model_dir", str(model_dir), "--train_input_path", str(data / "train"),
                   "--eval_input_path", str(data / "eval"),
                   env={"HASHREC_STEP_TIMING": "1", "HASHREC_STEP_TIMING_WARMUP": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "storage plan for 2 rank(s)" in run.stderr
    # Step timing: rank 0's file holds every rank's summary, windows with their phases.
    with open(model_dir / "step_timing.json", encoding="utf-8") as f:
        timing = json.load(f)
    assert [r["steps"] for r in timing["ranks"]] == [3, 3]
    assert timing["ranks"][0]["phases_ms"] == timing["phases_ms"]
    assert all("embedding_forward" in w["phases_ms"] for r in timing["ranks"]
               for w in r["windows"])
    assert "a2a" in run.stderr and "ms/step" in run.stderr
    (checkpoint,) = glob.glob(str(model_dir / "model.ckpt-*"))
    tables = glob.glob(os.path.join(checkpoint, "dynamicemb", "*"))
    assert tables
    for table in tables:
        shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(table, "*.bin")))
        assert shards == ["rank-00000-of-00002.bin", "rank-00001-of-00002.bin"], table
    with open(model_dir / "eval_result.txt", encoding="utf-8") as f:
        (trained,) = [json.loads(line) for line in f if line.strip()]
    assert trained["num_examples"] == EVAL_ROWS
    # The 401/400-row shares at batch 100 give 5 and 4 batches: all ranks stop at 4.
    assert trained["step"] == 4

    again = torchrun("hashrec.eval", "--pipeline_config_path", CONFIG,
                     "--checkpoint_path", checkpoint, "--model_dir", str(model_dir),
                     "--eval_input_path", str(data / "eval"))
    assert again.returncode == 0, again.stderr[-4000:]
    with open(model_dir / "eval_result.txt", encoding="utf-8") as f:
        results = [json.loads(line) for line in f if line.strip()]
    assert len(results) == 2
    assert results[1]["num_examples"] == EVAL_ROWS
    assert results[1]["auc"] == pytest.approx(trained["auc"], abs=1e-6)
    assert results[1]["loss"] == pytest.approx(trained["loss"], rel=1e-5)

"""bench_tdm_tools runs end to end in --quick mode and writes its results: the retrieval
(tree search and the every-item baseline, each split into pair building, model and the
rest) and cluster_tree, with the command, date, device and versions. No timing is
checked, only the results' structure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPLIT = {"seconds", "rows_per_s", "pairs_s", "model_s", "other_s"}


def test_quick_run_writes_every_measurement(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/bench_tdm_tools.py", "--quick",
                           "--device", "cpu", "--out", str(tmp_path / "tdm")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "tdm.json").read_text())
    assert result["command"].startswith("python benchmarks/bench_tdm_tools.py --quick")
    assert {"date", "gpu", "torch", "triton"} <= set(result["environment"])
    assert result["device"] == "cpu" and result["device_name"].startswith("cpu")
    retrieval = result["retrieval"]
    # 1,024 items under 1,023 nodes; TorchEasyRec's first level for beam 16: 32 nodes
    assert (retrieval["items"], retrieval["nodes"], retrieval["levels"]) == (1024, 2047, 11)
    assert (retrieval["first_level"], retrieval["levels_searched"]) == (5, 6)
    assert "TDM model" in retrieval["scorer"]
    for search in ("tree", "every_item"):
        split = retrieval[search]
        assert set(split) == SPLIT
        assert all(split[key] >= 0 for key in SPLIT) and split["rows_per_s"] > 0
        assert split["pairs_s"] + split["model_s"] + split["other_s"] == \
            pytest.approx(split["seconds"])
    assert retrieval["speedup"] > 0 and 0 <= retrieval["tree_recall_of_exact_top"] <= 1
    assert [c["items"] for c in result["cluster_tree"]] == [512, 1024]
    assert all(c["cluster_codes_s"] > 0 and c["dim"] == 16 for c in result["cluster_tree"])
    table = (tmp_path / "tdm.md").read_text()
    assert table in done.stdout
    for line in ("| search | user rows/s | seconds | pair building s | model s | other s |",
                 "| tree (beam search) |", "| every item (baseline) |",
                 "| items | dim | children | k-means s | tree_of_leaves s |",
                 "| 1,024 | 16 | 2 |"):
        assert line in table, line
    assert "`python benchmarks/bench_tdm_tools.py --quick" in table

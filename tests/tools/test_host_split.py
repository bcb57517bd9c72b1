"""host_split on the CPU: functions timed and their operators counted, and two results
compared by host_split_diff."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import host_split  # noqa: E402
import host_split_diff  # noqa: E402

from hashrec.tools import gen_taobao_data  # noqa: E402


def test_host_split_counts_operators_and_two_results_compare(tmp_path):
    data = tmp_path / "data"
    gen_taobao_data.main(["--output_dir", str(data), "--num_rows", "3000", "--num_files", "1",
                          "--quiet"])
    runs = {}
    for name, extra in (("plain", []), ("ops", ["--ops"])):
        out = str(tmp_path / name)
        assert host_split.main(["--data", str(data), "--batch_size", "256", "--warmup", "2",
                                "--steps", "2", "--out", out, *extra]) == 0
        with open(out + ".json", encoding="utf-8") as f:
            runs[name] = json.load(f)
    rows = {r["function"]: r for r in runs["ops"]["rows"]}
    step = rows["TrainLoop.train_step"]
    assert step["calls_per_step"] == 1.0 and step["ms_per_step"] > 0
    # Inclusive counts: the step dispatches at least what its parts do, and some.
    assert step["ops_per_step"] >= rows["MixedPrecision.backward"]["ops_per_step"] > 0
    assert all("ops_per_step" not in r for r in runs["plain"]["rows"])
    assert "operators/step" in open(str(tmp_path / "ops.md"), encoding="utf-8").read()

    result, text = host_split_diff.compare(runs["plain"], runs["ops"], ("plain", "ops"))
    diff = {r["function"]: r for r in result["rows"]}["TrainLoop.train_step"]
    assert diff["diff_ms"] == diff["b_ms"] - diff["a_ms"] and "a_ops" not in diff
    assert "| `TrainLoop.train_step` |" in text
    result, text = host_split_diff.compare(runs["ops"], runs["ops"], ("ops", "ops"))
    assert all(r["diff_ms"] == 0 and r["a_ops"] == r["b_ops"] for r in result["rows"])
    assert "A ops | B ops" in text

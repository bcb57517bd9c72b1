"""bench_train's trainer runner: a trainer that wrote its results but hangs at exit is
ended after a grace period, its results kept; a trainer that fails still fails."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_train  # noqa: E402


def test_a_trainer_hanging_after_its_results_is_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_train, "EXIT_GRACE_S", 1)
    done = tmp_path / "step_timing.json"
    script = (f"import time; print('step 1 | loss 0.5 | a2a 2.5 ms/step', flush=True); "
              f"open({str(done)!r}, 'w').write('{{}}'); time.sleep(120)")
    assert bench_train._run_logged([sys.executable, "-c", script], dict(os.environ),
                                   str(done)) == [2.5]


def test_a_failing_trainer_still_fails(tmp_path):
    script = "import sys; print('no results', flush=True); sys.exit(3)"
    with pytest.raises(RuntimeError, match="exit code 3"):
        bench_train._run_logged([sys.executable, "-c", script], dict(os.environ),
                                str(tmp_path / "step_timing.json"))


def test_markdown_lists_each_ranks_phases_and_worst_window():
    def summary(emb_fwd, worst_fwd, share):
        return {"phases_ms": {"embedding_forward": emb_fwd, "step": 8.0},
                "windows": [{"global_samples_per_second": 2.0e6,
                             "phases_ms": {"embedding_forward": emb_fwd}},
                            {"global_samples_per_second": 1.5e6,
                             "phases_ms": {"embedding_forward": worst_fwd}}],
                "host_threads": {"main_thread_cpu_share": share}}
    rank0, rank1 = summary(2.1, 3.3, 0.73), summary(1.7, 2.5, 0.81)
    lines = bench_train._rank_lines({"dynamicemb": {**rank0, "ranks": [rank0, rank1]}})
    rows = [line for line in lines if line.startswith("| dynamicemb")]
    assert [row.split(" | ")[1] for row in rows] == ["0", "1"]
    assert "| 2.10 |" in rows[0] and "| 3.30 |" in rows[0] and rows[0].endswith("73% |")
    assert "| 1.70 |" in rows[1] and "| 2.50 |" in rows[1] and rows[1].endswith("81% |")
    assert bench_train._rank_lines({"dynamicemb": rank0}) == []

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

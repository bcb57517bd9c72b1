"""bench_scaling's summary: every round's speed-up and the speed-up of the medians."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_scaling  # noqa: E402


def _run(rate, step, a2a=None):
    run = {"global_samples_per_second": rate, "phases_ms": {"step": step},
           "per_gpu_batch": 8192, "environment": {"gpu": "X", "date": "D"}}
    if a2a is not None:
        run["a2a_ms_per_step"] = a2a
    return run


def test_rounds_and_the_medians_speed_up():
    singles = [_run(1.0e6, 8.0), _run(1.2e6, 7.0), _run(0.9e6, 9.0)]
    multis = [_run(1.9e6, 8.5, 0.1), _run(2.0e6, 8.2, 0.2), _run(1.5e6, 10.0, 0.3)]
    summary = bench_scaling.summarize(singles, multis, "dynamicemb", 2, "cmd")
    assert [r["speedup"] for r in summary["rounds"]] == pytest.approx([1.9, 2.0 / 1.2, 1.5 / 0.9])
    assert summary["median_samples_per_second"] == {"1": 1.0e6, "2": 1.9e6}
    assert summary["speedup"] == pytest.approx(1.9)
    text = bench_scaling.markdown(summary)
    assert "| 2 | 1,200,000 | 2,000,000 | 1.67x | 7.00 / 8.20 | 0.20 |" in text
    assert "speed-up of the medians on 2 processes: 1.90x" in text and "`cmd`" in text

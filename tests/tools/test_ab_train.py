"""ab_train's summary: medians, ratios to the first tree, and each rank's embedding phases."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import ab_train  # noqa: E402


def _report(rate, ranks=None):
    run = {"global_samples_per_second": rate, "phases_ms": {"step": 8.0},
           "host_threads": {"main_thread_cpu_share": 0.7}}
    if ranks is not None:
        run["ranks"] = [{"phases_ms": {"embedding_forward": f, "embedding_backward": b}}
                        for f, b in ranks]
    return {"runs": {"dynamicemb": run}}


def test_summary_and_markdown_with_ranks():
    reports = {"a": [_report(1.0e6, [(2.0, 0.4), (1.8, 0.2)]), _report(1.2e6)],
               "b": [_report(1.5e6, [(1.7, 0.3), (1.6, 0.1)]), _report(1.3e6)]}
    trees = ab_train.summarize(["a", "b"], reports)
    assert trees["a"]["dynamicemb"]["median"] == pytest.approx(1.1e6)
    assert trees["b"]["dynamicemb"]["ratio_to_first"] == pytest.approx(1.4 / 1.1)
    text = ab_train.markdown({"trees": trees, "rounds": 2, "date": "D", "environment": "E",
                              "command": "cmd"})
    assert "| `a` | dynamicemb | 2.00 / 0.40, 1.80 / 0.20; - |" in text
    assert "| `b` | dynamicemb | 1.70 / 0.30, 1.60 / 0.10; - |" in text
    one_rank = ab_train.summarize(["a"], {"a": [_report(1.0e6)]})
    assert "Embedding forward / backward" not in ab_train.markdown(
        {"trees": one_rank, "rounds": 1, "date": "D", "environment": "E", "command": "c"})

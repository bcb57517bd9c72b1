"""The fine-tune summary: module paths shortened to what they share, levels."""

from __future__ import annotations

import logging

from hashrec.checkpoint.fine_tune_report import Outcome, collapse, summary

MODULES = ["towers.deep.layers.0", "towers.deep.layers.1", "towers.wide.layers.0",
           "final.layers.0", "output"]


def test_collapse_stops_below_a_module_of_mixed_fates():
    assert collapse(["towers.deep.layers.0", "towers.deep.layers.1", "output"], MODULES) == \
        ["output", "towers.deep"]
    assert collapse(["towers.deep.layers.0"], MODULES) == ["towers.deep.layers.0"]
    assert collapse(MODULES, MODULES) == ["final", "output", "towers"]
    assert collapse([], MODULES) == []


def test_summary_is_info_only_when_all_was_restored():
    level, text = summary("ckpt", Outcome(restored=list(MODULES)),
                          Outcome(restored=["b", "a"]), MODULES, MODULES)
    assert (level, text) == (logging.INFO,
                             "fine-tune start from ckpt: restored final, output, towers, "
                             "tables a, b")
    level, text = summary("ckpt", Outcome(restored=MODULES[:2], missing=MODULES[2:3],
                                          differs={"final.layers.0": "weight (2,) here"}),
                          Outcome(renamed={"uid": "user_id"}, unused=["old"]),
                          MODULES[:4], MODULES[:4])
    assert level == logging.WARNING
    assert text == ("fine-tune start from ckpt: restored towers.deep, table uid (from "
                    "user_id); start fresh, not in the checkpoint: towers.wide; start fresh, "
                    "shape or kind differs: final.layers.0 (weight (2,) here); in the "
                    "checkpoint but read by nothing: table old")

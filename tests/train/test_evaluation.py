"""The evaluation result file: one JSON line per evaluation, and one clear error when it
cannot be written."""

from __future__ import annotations

import json
import os

import pytest

from hashrec.checkpoint.layout import MARKER_NAME
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import best_checkpoint, write_eval_result


def test_results_are_appended_as_json_lines(tmp_path):
    model_dir = tmp_path / "model"
    write_eval_result(str(model_dir), {"step": 5, "auc": float("nan"), "loss": 0.5},
                      checkpoint=str(model_dir / "model.ckpt-5"))
    write_eval_result(str(model_dir), {"step": 9, "auc": 0.75, "loss": 0.25})
    write_eval_result(str(model_dir), {"step": 9, "auc": 0.5}, rank=1)  # rank 0 writes
    lines = (model_dir / "eval_result.txt").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 5, "global_step": 5, "auc": None, "loss": 0.5,
         "checkpoint": str(model_dir / "model.ckpt-5")},
        {"step": 9, "global_step": 9, "auc": 0.75, "loss": 0.25}]


@pytest.mark.parametrize("target", ["directory", "full-disk"])
def test_an_unwritable_result_file_is_one_error_naming_it(tmp_path, target):
    path = tmp_path / "eval_result.txt"
    if target == "directory":
        path.mkdir()
        reason = "Is a directory"
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("needs /dev/full (Linux)")
        os.symlink("/dev/full", path)  # fails every write with ENOSPC, as a full disk does
        reason = ("No space left on device; the disk may be full: free space and run "
                  "again")
    with pytest.raises(TrainError) as info:
        write_eval_result(str(tmp_path), {"step": 5, "auc": 0.75})
    assert str(info.value) == (f"cannot append the evaluation result of step 5 to {path}: "
                               f"{reason}; the result is in the log line above")


def _checkpoints(model_dir, steps) -> None:
    for step in steps:
        path = model_dir / f"model.ckpt-{step}"
        path.mkdir(parents=True)
        (path / MARKER_NAME).write_text("")


def _result(model_dir, step: int, **metrics) -> None:
    write_eval_result(str(model_dir), {"step": step, **metrics},
                      checkpoint=str(model_dir / f"model.ckpt-{step}"))


def test_the_best_checkpoint_is_the_best_evaluated_one_still_there(tmp_path):
    model = tmp_path / "model"
    _checkpoints(model, [20, 30, 40])  # 10 was pruned
    assert best_checkpoint(str(model), "auc") is None  # nothing evaluated yet
    _result(model, 10, auc=0.9, loss=0.1)
    assert best_checkpoint(str(model), "auc") is None  # its checkpoint is gone
    _result(model, 20, auc=0.7, loss=0.3)
    _result(model, 30, auc=0.8, loss=0.2)
    _result(model, 40, auc=float("nan"), loss=0.5)  # undefined: never best
    with open(model / "eval_result.txt", "a", encoding="utf-8") as f:
        f.write('{"step": 40, "auc": 0.9')  # a line a crash cut short
    assert best_checkpoint(str(model), "auc") == str(model / "model.ckpt-30")
    assert best_checkpoint(str(model), "loss", larger_is_better=False) == \
        str(model / "model.ckpt-30")
    _result(model, 40, auc=0.8)  # equal scores: the later step
    assert best_checkpoint(str(model), "auc") == str(model / "model.ckpt-40")
    _result(model, 30, auc=0.6)  # evaluated again: its last result counts
    assert best_checkpoint(str(model), "auc") == str(model / "model.ckpt-40")
    with pytest.raises(TrainError, match=r"best_exporter_metric 'auc_ctr': no result in "
                                         r".*eval_result.txt holds it \(they hold auc, loss\)"):
        best_checkpoint(str(model), "auc_ctr")

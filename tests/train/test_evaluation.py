"""The evaluation result file: one JSON line per evaluation, and one clear error when it
cannot be written."""

from __future__ import annotations

import json
import os

import pytest

from hashrec.train.errors import TrainError
from hashrec.train.evaluation import write_eval_result


def test_results_are_appended_as_json_lines(tmp_path):
    model_dir = tmp_path / "model"
    write_eval_result(str(model_dir), {"step": 5, "auc": float("nan"), "loss": 0.5},
                      checkpoint=str(model_dir / "model.ckpt-5"))
    write_eval_result(str(model_dir), {"step": 9, "auc": 0.75, "loss": 0.25})
    write_eval_result(str(model_dir), {"step": 9, "auc": 0.5}, rank=1)  # rank 0 writes
    lines = (model_dir / "eval_result.txt").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 5, "auc": None, "loss": 0.5, "checkpoint": str(model_dir / "model.ckpt-5")},
        {"step": 9, "auc": 0.75, "loss": 0.25}]


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

"""The evaluation result file: one JSON line per evaluation, and one clear error when it
cannot be written; the warnings of an evaluation of soft labels or of one class."""

from __future__ import annotations

import json
import logging
import math
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from small_din import generate_data, small_loop
from tiny_pipeline import MULTI_TOWER, pipeline_text

from hashrec.checkpoint.layout import MARKER_NAME
from hashrec.config import parse_pipeline_config
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import best_checkpoint, evaluate, write_eval_result
from hashrec.train.session import build_session


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


def _tiny_session(root, clk, metrics: str = "metrics { auc {} } metrics { accuracy {} }"):
    """A session of a tiny MultiTower and an eval file of ``clk`` labels (its rows' users
    and prices drawn at random)."""
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"user_id": rng.integers(0, 20, len(clk)),
                             "price": rng.random(len(clk)), "clk": clk}),
                   root / "data" / "eval.parquet")
    config = parse_pipeline_config(pipeline_text(root, '"clk"', f"{MULTI_TOWER} {metrics}"))
    return build_session(config, device=torch.device("cpu"))


def test_soft_labels_train_the_loss_and_are_thresholded_by_the_metrics(tmp_path, caplog):
    clk = np.random.default_rng(1).random(150)  # rates in (0, 1), as a distilled teacher's
    session = _tiny_session(tmp_path, clk)
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        result = evaluate(session, str(tmp_path / "data" / "eval.parquet"), step=0)
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(pq.read_table(tmp_path / "data" / "eval.parquet"))
        out = session.model(batch)
    labels = batch.labels["clk"]
    assert labels.tolist() == pytest.approx(clk.tolist())
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out["logits"], labels)
    assert result["binary_cross_entropy"] == pytest.approx(float(bce), rel=1e-5)
    hard = (labels > 0.5).float()
    assert result["accuracy"] == pytest.approx(float(((out["probs"] > 0.5) == hard).float()
                                                     .mean()))
    assert 0 < result["auc"] < 1
    assert "label column 'clk': 150 of 150 evaluated rows hold a soft label (strictly " \
           "between 0 and 1); auc, accuracy count a row positive where its label is > 0.5" \
           in caplog.text


@pytest.mark.parametrize("label", [0, 1], ids=["negatives", "positives"])
def test_an_auc_of_one_class_is_nan_with_a_warning_saying_why(tmp_path, caplog, label):
    session = _tiny_session(tmp_path, np.full(40, label),
                            'metrics { auc {} } metrics { grouped_auc { grouping_key: '
                            '"user_id" } }')
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        result = evaluate(session, str(tmp_path / "data" / "eval.parquet"), step=3)
    assert math.isnan(result["auc"]) and math.isnan(result["grouped_auc"])
    counts = (40, 0) if label else (0, 40)
    assert (f"eval at step 3: auc is undefined (NaN): the evaluation has {counts[0]} positive "
            f"and {counts[1]} negative rows; an AUC needs both") in caplog.text
    assert (f"eval at step 3: grouped_auc is undefined (NaN): no group of 'user_id' holds "
            f"both a positive and a negative row ({counts[0]} positive rows of 40)") \
        in caplog.text
    assert "soft label" not in caplog.text


@pytest.mark.parametrize("max_steps,expected", [
    (0, [("2", "6"), ("4", "6"), ("6", "6")]), (3, [("2", "3")])], ids=["all", "num_steps3"])
def test_the_progress_lines_count_the_batches_of_the_evaluation(tmp_path, caplog, max_steps,
                                                                expected):
    generate_data(tmp_path / "data", seed=0)  # 1,500 rows: 6 batches of 256
    session = small_loop(tmp_path / "m", edits={
        "eval_config.log_step_count_steps": 2, "data_config.eval_batch_size": 256}).session
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        evaluate(session, str(tmp_path / "data"), 0, max_steps)
    lines = [r.getMessage() for r in caplog.records
             if re.match(r"eval at step 0: \d+ of", r.getMessage())]
    assert [re.match(r"eval at step 0: (\d+) of (\d+) batches", line).groups()
            for line in lines] == expected
    assert ["left)" in line for line in lines] == [a != b for a, b in expected]


def test_evaluation_logs_the_share_of_ids_each_dynamic_table_found(tmp_path, caplog):
    from small_din import generate_data, small_loop

    from hashrec.train.evaluation import evaluate

    generate_data(tmp_path / "data", seed=5)
    loop = small_loop(tmp_path / "m")
    data = str(tmp_path / "data")

    def shares() -> dict[str, float]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hashrec.train"):
            assert evaluate(loop.session, data, loop.step)["num_examples"] == 1500
        (line,) = [r.getMessage() for r in caplog.records if "ids found" in r.getMessage()]
        listed = line.split("eval initializer): ")[1].split(", ")
        return {name: float(share[:-1]) for name, share in (t.split(" ") for t in listed)}

    fresh = shares()  # nothing trained: every table is empty
    assert fresh == dict.fromkeys(["user_id", "adgroup_id", "brand", "campaign_id",
                                   "customer", "cate_id"], 0.0)  # dynamic tables only
    loop.run(data)
    trained = shares()  # after 4 steps on these rows: some ids admitted (threshold 3)
    assert set(trained) == set(fresh) and 0 < trained["cate_id"] <= 100

"""A model of three classes (softmax_cross_entropy with label smoothing), one trained on
binary_focal_loss and an MMoE with a binary, a three-class and a jrc_loss tower, end to end
on generated parquet: train_eval, eval, export and predict (the classes' logits and probs
written as a list a row), with the losses the results report checked against their
formulas on the restored model's outputs."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tiny_pipeline import MULTI_TOWER, exported_predictions, restored_outputs, train_tiny

from hashrec.features import build_feature_set
from hashrec.features.errors import FeatureError

CLASSES = MULTI_TOWER + """ num_class: 3
  losses { softmax_cross_entropy { label_smoothing: 0.1 } }
  metrics { accuracy { top_k: 2 } }
  metrics { multiclass_auc { average: "weighted" } }"""
FOCAL = MULTI_TOWER + " losses { binary_focal_loss { gamma: 2.0 alpha: 0.25 } }"
# MMoE: a binary tower, a tower of three classes and a jrc_loss tower whose sessions are a
# feature no feature group names (parsed for the loss, not embedded, not read by predict).
MULTI_TASK = """mmoe {
    expert_mlp { hidden_units: [8] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" }
    task_towers { tower_name: "level" label_name: "level" num_class: 3
                  losses { softmax_cross_entropy {} } metrics { accuracy {} } }
    task_towers { tower_name: "jrc" label_name: "clk" num_class: 2
                  losses { jrc_loss { session_name: "session" } } }
  }"""
SESSION = """feature_configs { id_feature { feature_name: "session" expression: "user:sid"
  hash_bucket_size: 1000 embedding_dim: 4 } }"""


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 30, rows)
    price = rng.random(rows)
    level = (users % 3 + (price > 0.5)) % 3  # a class each user and price half decide
    return pa.table({"user_id": users, "price": price, "level": level,
                     "clk": (level == 0).astype(np.int64), "sid": np.arange(rows) // 8})


def _trained(root, labels: str, model: str, **kwargs):
    return train_tiny(root, _table, labels, model, **kwargs)


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("classes"), '"level"', CLASSES, epochs=4)


@pytest.fixture(scope="module")
def focal(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("focal"), '"clk"', FOCAL, epochs=4)


@pytest.fixture(scope="module")
def multi_task(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("multi_task"), '["clk", "level"]', MULTI_TASK,
                    epochs=2, features=SESSION)


def test_three_classes_learn_and_report_their_metrics(classes):
    root, config, result = classes
    assert {"accuracy", "multiclass_auc", "softmax_cross_entropy"} <= set(result)
    assert "auc" not in result
    assert result["accuracy"] > 0.9 and result["multiclass_auc"] > 0.8  # chance: 2/3, 0.5
    out, batch = restored_outputs(root, config)
    assert set(out) == {"logits", "probs"} and out["logits"].shape == (320, 3)
    torch.testing.assert_close(out["probs"], torch.softmax(out["logits"], -1))
    # The smoothed cross entropy by hand: -(0.9 log p_y + 0.1 / 3 sum_c log p_c).
    log_p = torch.log_softmax(out["logits"], -1)
    level = batch.labels["level"].long()
    hand = -(0.9 * log_p.gather(1, level[:, None])[:, 0] + 0.1 / 3 * log_p.sum(-1)).mean()
    assert result["softmax_cross_entropy"] == pytest.approx(float(hand), rel=1e-4)
    top2 = out["probs"].topk(2, -1).indices
    assert result["accuracy"] == pytest.approx(float((top2 == level[:, None]).any(-1)
                                                     .float().mean()))


def test_eval_writes_the_class_metrics(classes):
    from hashrec.eval import main

    root, _, result = classes
    assert main(["--pipeline_config_path", str(root / "m" / "pipeline.config")]) == 0
    with open(root / "m" / "eval_result.txt", encoding="utf-8") as f:
        last = json.loads(f.read().splitlines()[-1])
    for key in ("accuracy", "multiclass_auc", "softmax_cross_entropy"):
        assert last[key] == pytest.approx(result[key], rel=1e-6)


def test_predict_writes_a_list_of_the_classes_a_row(classes, tmp_path):
    root, config, _ = classes
    table = exported_predictions(root, config, tmp_path, reserved=("level",))
    assert table.column_names == ["logits", "probs", "level"]
    assert table.schema.field("probs").type == pa.list_(pa.float32())
    probs = np.array(table.column("probs").to_pylist())
    assert probs.shape == (320, 3) and np.allclose(probs.sum(1), 1, atol=1e-5)
    eager, _ = restored_outputs(root, config)
    np.testing.assert_allclose(probs, eager["probs"].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(table.column("logits").to_pylist()),
                               eager["logits"].numpy(), atol=1e-4)


def test_a_label_out_of_the_classes_names_the_row_and_the_range(classes):
    _, config, _ = classes
    bad = _table(8, 2).set_column(2, "level", pa.array([0, 1, 2, 3, 0, 1, 2, 0]))
    with pytest.raises(FeatureError, match=r"label column 'level'.* row 3.* value 3 is not "
                                           r"a class id in \[0, 3\)"):
        build_feature_set(config).parse(bad)


def test_focal_loss_trains_and_is_its_formula_on_the_eval_rows(focal, tmp_path):
    root, config, result = focal
    assert {"auc", "binary_focal_loss"} <= set(result) and result["auc"] > 0.8
    out, batch = restored_outputs(root, config)
    p, y = out["probs"].double(), batch.labels["clk"].double()
    factor = 0.25 * y * (1 - p) ** 2 + 0.75 * (1 - y) * p ** 2
    bce = -(y * p.log() + (1 - y) * (1 - p).log())
    assert result["binary_focal_loss"] == pytest.approx(float((factor * bce).mean()), rel=1e-4)
    written = exported_predictions(root, config, tmp_path)
    assert written.column_names == ["logits", "probs"]
    np.testing.assert_allclose(written.column("probs").to_numpy(), out["probs"].numpy(),
                               atol=1e-5)


def test_a_multi_task_model_of_classes_trains_exports_and_predicts(multi_task, tmp_path):
    root, config, result = multi_task
    assert {"auc_ctr", "accuracy_level", "auc_jrc", "binary_cross_entropy_ctr",
            "softmax_cross_entropy_level", "jrc_loss_jrc"} <= set(result)
    assert result["auc_ctr"] > 0.7 and result["auc_jrc"] > 0.7  # auc_jrc reads probs1
    assert result["accuracy_level"] > 0.5
    rows = pq.read_table(root / "data" / "eval.parquet").drop_columns(["sid"])
    pq.write_table(rows, tmp_path / "in.parquet")  # predict reads no session column
    table = exported_predictions(root, config, tmp_path, tmp_path / "in.parquet")
    assert table.column_names == ["logits_ctr", "logits_jrc", "logits_level", "probs1_jrc",
                                  "probs_ctr", "probs_jrc", "probs_level"]
    eager, _ = restored_outputs(root, config)
    for name in table.column_names:
        column = table.column(name)
        got = np.array(column.to_pylist()) if pa.types.is_list(column.type) else \
            column.to_numpy()
        np.testing.assert_allclose(got, eager[name].numpy(), atol=1e-5, err_msg=name)


def test_focal_loss_labels_must_be_in_0_1(focal):
    _, config, _ = focal
    bad = _table(4, 2).set_column(3, "clk", pa.array([0, 1, 2, 1]))
    with pytest.raises(FeatureError, match=r"row 2.* value 2 is not in \[0, 1\]; "
                                           r"binary_focal_loss trains on labels in \[0, 1\]"):
        build_feature_set(config).parse(bad)

"""data_config.sample_weight_fields: each row's loss weighted, in training and in the
evaluation loss; the weight column parsed, checked and read only with the labels."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import ConfigError, apply_edit_config_json, parse_pipeline_config
from hashrec.features import FeatureError, build_feature_set
from hashrec.train import train_and_evaluate
from hashrec.train.evaluation import evaluate
from hashrec.train.session import build_session

CONFIG = """
model_dir: "{model_dir}"
train_input_path: "{data}"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 1
}}
data_config {{
  batch_size: 32 dataset_type: ParquetDataset label_fields: "clk" num_workers: 0
  sample_weight_fields: "w"
}}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 num_buckets: 50 }} }}
feature_configs {{ raw_feature {{ feature_name: "price" expression: "item:price" }} }}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "price"] group_type: DEEP }}
  multi_tower_din {{ towers {{ input: "deep" mlp {{ hidden_units: [8] }} }}
    final {{ hidden_units: [4] }} }}
}}
"""


def _config(tmp_path, data: str = ""):
    return parse_pipeline_config(CONFIG.format(model_dir=tmp_path / "m", data=data))


def _table(rows: int, seed: int = 0, weights=None) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 50, rows)
    weights = rng.integers(0, 4, rows).astype(np.float64) if weights is None else weights
    return pa.table({"user_id": users, "price": rng.random(rows),
                     "clk": (users % 3 == 0).astype(np.int64), "w": weights})


def test_weights_are_parsed_with_the_labels_only(tmp_path):
    features = build_feature_set(_config(tmp_path))
    assert features.sample_weight_fields == ("w",) and "w" in features.input_columns
    batch = features.parse(_table(5, weights=[0.0, 1.0, 2.5, 0.0, 7.0]))
    assert batch.labels["w"].tolist() == [0.0, 1.0, 2.5, 0.0, 7.0]
    assert batch.labels["w"].dtype == torch.float32
    assert features.parse(_table(3).drop_columns(["clk", "w"]), with_labels=False).labels == {}


@pytest.mark.parametrize("weights, row", [
    (pa.array([1.0, -0.5, 1.0]), 1), (pa.array([1.0, 2.0, float("nan")]), 2),
    (pa.array([1.0, float("inf"), 1.0]), 1), (pa.array([None, 1.0, 1.0], pa.float64()), 0),
], ids=["negative", "nan", "inf", "null"])
def test_bad_weights_are_named_by_row(tmp_path, weights, row):
    features = build_feature_set(_config(tmp_path))
    table = _table(3).set_column(3, "w", weights)
    with pytest.raises(FeatureError, match=rf"sample weight column 'w' row {row}: value "
                                           rf".* is not a finite weight >= 0"):
        features.parse(table)
    listed = _table(3).set_column(3, "w", pa.array([[1.0], [2.0], [3.0]]))
    with pytest.raises(FeatureError, match="sample weight column 'w' has type list"):
        features.parse(listed)


def test_weights_from_text_read_as_numbers(tmp_path):
    # A CSV column without a type is text.
    features = build_feature_set(_config(tmp_path))
    table = _table(3).set_column(3, "w", pa.array(["1", "2.5", "0"]))
    assert features.parse(table).labels["w"].tolist() == [1.0, 2.5, 0.0]


@pytest.mark.parametrize("cells, detail", [
    (["1", "x", "1"], "row 1: value 'x' is not a number"),
    (["1", "1", ""], "row 2: value '' is not a finite weight >= 0"),
    (["-1", "1", "1"], "row 0: value '-1' is not a finite weight >= 0"),
], ids=["word", "empty", "negative"])
def test_weight_text_that_is_not_a_weight_names_its_row(tmp_path, cells, detail):
    features = build_feature_set(_config(tmp_path))
    table = _table(3).set_column(3, "w", pa.array(cells))
    with pytest.raises(FeatureError, match=rf"^sample weight column 'w' {detail}"):
        features.parse(table)


@pytest.mark.parametrize("edit, message", [
    ({"data_config.sample_weight_fields": ["w", "w"]}, "lists 'w' twice"),
    ({"data_config.sample_weight_fields": ["clk"]}, "'clk' is a label field"),
    ({"feature_configs[1].raw_feature.expression": "item:w"},
     "reads sample weight column 'w'; a sample weight cannot be a model input"),
], ids=["twice", "label", "feature-input"])
def test_weight_columns_are_checked(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        build_feature_set(apply_edit_config_json(_config(tmp_path), edit))


def test_the_loss_is_the_weighted_mean(tmp_path):
    session = build_session(_config(tmp_path), device=torch.device("cpu"))
    model = session.model
    batch = session.feature_set.parse(_table(16, seed=1))
    predictions = model(batch)
    y, w = batch.labels["clk"], batch.labels["w"]
    each = torch.nn.functional.binary_cross_entropy_with_logits(
        predictions["logits"], y, reduction="none")
    loss = model.loss(predictions, batch)["binary_cross_entropy"]
    assert torch.allclose(loss, (each * w).sum() / w.sum())
    # A row of weight 0 changes nothing: not its label, not its gradient.
    flipped = session.feature_set.parse(_table(16, seed=1))
    flipped.labels["clk"] = torch.where(w == 0, 1 - y, y)
    assert bool((w == 0).any())
    assert torch.allclose(model.loss(predictions, flipped)["binary_cross_entropy"], loss)
    zero = session.feature_set.parse(_table(4, weights=np.zeros(4)))
    assert float(model.loss(model(zero), zero)["binary_cross_entropy"].detach()) == 0.0


def test_training_and_evaluation_use_the_weights(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    # Positives weigh 0: the model trains on negatives only and learns to say 0.
    table = _table(640, seed=2)
    table = table.set_column(3, "w", pa.array(np.where(
        table.column("clk").to_numpy() == 1, 0.0, 1.0)))
    pq.write_table(table, data / "part-0.parquet")
    config = apply_edit_config_json(_config(tmp_path, str(data)),
                                    {"train_config.num_epochs": 10})
    session = build_session(config, device=torch.device("cpu"))
    train_and_evaluate(config)

    restore_checkpoint(latest_checkpoint(str(tmp_path / "m")), session.model, None,
                       session.model.embedding.dynamic_tables())
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        probs = session.model(batch)["probs"]
    assert float(probs[batch.labels["clk"] == 1].mean()) < 0.2  # positives never weighed
    # Evaluation: the loss is the weighted mean over all rows, whatever the batches'
    # weights (even batches weigh 1 a row, odd ones 5 and their positives 0).
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    table = _table(640, seed=3)
    odd = (np.arange(640) // 32) % 2 == 1
    table = table.set_column(3, "w", pa.array(np.where(
        odd, np.where(table.column("clk").to_numpy() == 1, 0.0, 5.0), 1.0)))
    pq.write_table(table, evaluation / "part-0.parquet")
    result = evaluate(session, str(evaluation), step=0)
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        probs = session.model(batch)["probs"]
    each = torch.nn.functional.binary_cross_entropy(probs, batch.labels["clk"],
                                                    reduction="none")
    w = batch.labels["w"]
    assert result["loss"] == pytest.approx(float((each * w).sum() / w.sum()), rel=1e-4)
    assert result["binary_cross_entropy"] == result["loss"]
    assert result["num_examples"] == 640


def test_the_evaluation_weighs_each_of_several_losses(tmp_path):
    # binary_cross_entropy and binary_focal_loss on one logit: each loss is its rows'
    # weighted mean, and the evaluation's loss their sum.
    config = apply_edit_config_json(_config(tmp_path), {
        "model_config.losses": ["binary_cross_entropy {}",
                                "binary_focal_loss { gamma: 1 alpha: 0.25 }"]})
    session = build_session(config, device=torch.device("cpu"))
    (tmp_path / "eval").mkdir()
    table = _table(100, seed=4)
    pq.write_table(table, tmp_path / "eval" / "part-0.parquet")
    result = evaluate(session, str(tmp_path / "eval"), step=0)
    session.model.eval()
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        logits = session.model(batch)["logits"]
    y, w = batch.labels["clk"], batch.labels["w"]
    from hashrec.models.losses import binary_focal_rows

    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    expected = {"binary_cross_entropy": float((bce * w).sum() / w.sum()),
                "binary_focal_loss": float((binary_focal_rows(logits, y, 1.0, 0.25) * w).sum()
                                           / w.sum())}
    assert {k: result[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    assert result["loss"] == pytest.approx(sum(expected.values()), rel=1e-5)


MULTI_TASK = """
data_config {{ label_fields: "buy" sample_weight_fields: "v" }}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "price"] group_type: DEEP }}
  mmoe {{ expert_mlp {{ hidden_units: [8] }} num_expert: 2
    task_towers {{ tower_name: "ctr" label_name: "clk" sample_weight_name: "v" }}
    task_towers {{ tower_name: "cvr" label_name: "buy" weight: 0.5 sample_weight_name: "w"
      task_space_indicator_label: "clk" in_task_space_weight: 2 out_task_space_weight: 0 }}
  }}
}}
"""


def _multi_task_config(tmp_path, data: str = ""):
    from google.protobuf import text_format

    config = _config(tmp_path, data)
    config.model_config.Clear()
    return text_format.Merge(MULTI_TASK.format(), config)


def _multi_task_table(rows: int, seed: int) -> pa.Table:
    table = _table(rows, seed)
    rng = np.random.default_rng(seed + 100)
    clk = table.column("clk").to_numpy()
    return table.append_column("buy", pa.array(clk * (rng.random(rows) < 0.5)
                                              .astype(np.int64))) \
        .append_column("v", pa.array(rng.integers(0, 3, rows).astype(np.float64)))


def test_a_multi_task_evaluation_loss_weighs_each_task_with_its_own_weights(tmp_path):
    data = tmp_path / "eval"
    data.mkdir()
    table = _multi_task_table(320, seed=4)
    pq.write_table(table, data / "part-0.parquet")
    config = _multi_task_config(tmp_path)
    session = build_session(config, device=torch.device("cpu"))
    assert session.feature_set.sample_weight_fields == ("w", "v")
    result = evaluate(session, str(data), step=0)
    with torch.no_grad():
        batch = session.feature_set.parse(table)
        out = session.model(batch)
    labels = batch.labels

    def mean(task: str, label: str, w: torch.Tensor) -> float:
        each = torch.nn.functional.binary_cross_entropy_with_logits(
            out[f"logits_{task}"], labels[label], reduction="none")
        return float((each * w).sum() / w.sum())

    ctr = mean("ctr", "clk", labels["v"])
    cvr = 0.5 * mean("cvr", "buy", labels["w"] * torch.where(labels["clk"] > 0, 2.0, 0.0))
    assert result["loss"] == pytest.approx(ctr + cvr, rel=1e-4)
    # Each task loss under its name too, as TorchEasyRec reports them.
    assert result["binary_cross_entropy_ctr"] == pytest.approx(ctr, rel=1e-4)
    assert result["binary_cross_entropy_cvr"] == pytest.approx(cvr, rel=1e-4)
    assert result["num_examples"] == 320


def test_a_multi_task_model_trains_with_task_weights(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(_multi_task_table(256, seed=5), data / "part-0.parquet")
    config = _multi_task_config(tmp_path, str(data))
    config.eval_input_path = str(data)
    train_and_evaluate(config)
    assert latest_checkpoint(str(tmp_path / "m")) is not None

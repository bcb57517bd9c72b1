"""l2_loss: a regression model predicts values (``y``, the logits themselves), trains on
the squared error, evaluates mean squared error by default, and exports and predicts
``y``."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import parse_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate
from hashrec.train.session import build_session

CONFIG = """
model_dir: "{root}/m"
train_input_path: "{root}/data/train.parquet"
eval_input_path: "{root}/data/eval.parquet"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 8
}}
data_config {{ batch_size: 64 dataset_type: ParquetDataset label_fields: "minutes"
  num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 dynamicemb {{ max_capacity: 256 }} }} }}
feature_configs {{ raw_feature {{ feature_name: "price" expression: "item:price" }} }}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "price"] group_type: DEEP }}
  multi_tower {{ towers {{ input: "deep" mlp {{ hidden_units: [8] }} }} }}
  losses {{ l2_loss {{}} }}
}}
"""


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 20, rows)
    price = rng.random(rows)
    # Watch minutes: a per-user level plus the price; far outside [0, 1].
    minutes = 5.0 + (users % 5) * 2.0 + 3.0 * price + rng.normal(0, 0.1, rows)
    return pa.table({"user_id": users, "price": price, "minutes": minutes})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("regression")
    (root / "data").mkdir()
    pq.write_table(_table(1280, 0), root / "data" / "train.parquet")
    pq.write_table(_table(320, 1), root / "data" / "eval.parquet")
    config = parse_pipeline_config(CONFIG.format(root=root))
    return root, config, train_and_evaluate(config)


def test_the_model_learns_values_and_reports_mean_squared_error(trained):
    root, config, result = trained
    assert "mean_squared_error" in result and "auc" not in result
    minutes = pq.read_table(root / "data" / "eval.parquet").column("minutes").to_numpy()
    assert result["mean_squared_error"] < 0.1 * minutes.var()  # far better than the mean
    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(latest_checkpoint(str(root / "m")), session.model, None,
                       session.model.embedding.dynamic_tables())
    session.model.eval()
    batch = session.feature_set.parse(pq.read_table(root / "data" / "eval.parquet"))
    with torch.no_grad():
        out = session.model(batch)
    assert set(out) == {"logits", "y"} and torch.equal(out["y"], out["logits"])
    squared = float(((out["y"] - batch.labels["minutes"]) ** 2).mean())
    assert result["mean_squared_error"] == pytest.approx(squared, rel=1e-4)
    assert result["loss"] == pytest.approx(squared, rel=1e-4)  # l2_loss is the same mean


def test_export_and_predict_write_y(trained, tmp_path):
    root, config, _ = trained
    export_model(config, str(tmp_path / "e"), latest_checkpoint(str(root / "m")))
    out = predict(str(tmp_path / "e"), str(root / "data" / "eval.parquet"),
                  str(tmp_path / "p.parquet"), reserved_columns=("minutes",))
    table = pq.read_table(out["output"])
    assert table.column_names == ["logits", "y", "minutes"]
    y = table.column("y").to_numpy()
    assert np.mean((y - table.column("minutes").to_numpy()) ** 2) < 1.0
    with open(os.path.join(tmp_path, "e", "pipeline.config"), encoding="utf-8") as f:
        assert "l2_loss" in f.read()

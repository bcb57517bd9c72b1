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
from tiny_pipeline import MULTI_TOWER, exported_predictions, restored_outputs, train_tiny


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 20, rows)
    price = rng.random(rows)
    # Watch minutes: a per-user level plus the price; far outside [0, 1].
    minutes = 5.0 + (users % 5) * 2.0 + 3.0 * price + rng.normal(0, 0.1, rows)
    return pa.table({"user_id": users, "price": price, "minutes": minutes})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("regression"), _table, '"minutes"',
                      MULTI_TOWER + " losses { l2_loss {} }")


def test_the_model_learns_values_and_reports_mean_squared_error(trained):
    root, config, result = trained
    assert "mean_squared_error" in result and "auc" not in result
    minutes = pq.read_table(root / "data" / "eval.parquet").column("minutes").to_numpy()
    assert result["mean_squared_error"] < 0.1 * minutes.var()  # far better than the mean
    out, batch = restored_outputs(root, config)
    assert set(out) == {"logits", "y"} and torch.equal(out["y"], out["logits"])
    squared = float(((out["y"] - batch.labels["minutes"]) ** 2).mean())
    assert result["mean_squared_error"] == pytest.approx(squared, rel=1e-4)
    assert result["loss"] == pytest.approx(squared, rel=1e-4)  # l2_loss is the same mean


def test_export_and_predict_write_y(trained, tmp_path):
    root, config, _ = trained
    table = exported_predictions(root, config, tmp_path, reserved=("minutes",))
    assert table.column_names == ["logits", "y", "minutes"]
    y = table.column("y").to_numpy()
    assert np.mean((y - table.column("minutes").to_numpy()) ** 2) < 1.0
    with open(os.path.join(tmp_path, "e", "pipeline.config"), encoding="utf-8") as f:
        assert "l2_loss" in f.read()

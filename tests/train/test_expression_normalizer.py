"""A raw feature normalized by an expression (TorchEasyRec's dlrm_criteo uses
``method=expression,expr=log(x+3)``) trains, evaluates, exports and predicts with the same
normalization."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tiny_pipeline import (
    MULTI_TOWER,
    exported_predictions,
    pipeline_text,
    restored_outputs,
    restored_session,
    train_tiny,
)

from hashrec.config import parse_pipeline_config
from hashrec.data import DataError
from hashrec.features import build_feature_set

NORMALIZER = 'normalizer: "method=expression,expr=log(x+3)"'


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 20, rows)
    # counts from -2 to about 1000, as Criteo's integer columns: log(x+3) evens them out
    price = np.floor(np.exp(rng.uniform(0, 7, rows))) - 3.0
    clicked = (np.log(price + 3) + rng.normal(0, 0.5, rows) > 3.5).astype(np.int64)
    return pa.table({"user_id": users, "price": price, "y": clicked})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("expression_normalizer"), _table, '"y"',
                      MULTI_TOWER, rows=(640, 160), epochs=3, price=NORMALIZER)


def test_training_reads_the_normalized_values(trained):
    root, config, result = trained
    assert result["auc"] > 0.8
    _, batch = restored_outputs(root, config)
    price = pq.read_table(root / "data" / "eval.parquet").column("price").to_numpy()
    assert price.min() == -2.0 and price.max() > 500
    np.testing.assert_allclose(batch.dense["price"][:, 0].numpy(), np.log(price + 3),
                               rtol=1e-6)


def test_predict_normalizes_as_eval_does(trained, tmp_path):
    root, config, _ = trained
    eager, _ = restored_outputs(root, config)
    table = exported_predictions(root, config, tmp_path)
    np.testing.assert_allclose(table.column("probs").to_numpy(), eager["probs"].numpy(),
                               atol=1e-5)
    with open(tmp_path / "e" / "pipeline.config", encoding="utf-8") as f:
        assert "method=expression,expr=log(x+3)" in f.read()
    # the same model fed the values as they are predicts otherwise: the rows need it
    plain = parse_pipeline_config(pipeline_text(root, '"y"', MULTI_TOWER, epochs=3))
    raw_batch = build_feature_set(plain).parse(pq.read_table(root / "data" / "eval.parquet"))
    with torch.no_grad():
        unnormalized = restored_session(root, config).model(raw_batch)["probs"].numpy()
    assert np.abs(unnormalized - eager["probs"].numpy()).max() > 0.1


def test_predict_refuses_a_value_the_expression_makes_infinite(trained, tmp_path):
    root, config, _ = trained
    rows = _table(20, 2)
    rows = rows.set_column(1, "price", pa.array([1.0] * 19 + [-3.0]))
    pq.write_table(rows, tmp_path / "in.parquet")
    with pytest.raises(DataError, match=r"feature 'price': column 'price'.* row 19: value -3 "
                                        r"becomes -inf under normalizer "
                                        r"'method=expression,expr=log\(x\+3\)'"):
        exported_predictions(root, config, tmp_path, tmp_path / "in.parquet")


"""A batch with a sampler's negative rows after it: a dense raw feature of columns the
sampler leaves empty (the user side's) reads zeros there where it has no value for a
missing cell (encoded input's case), its value where it has one; features of the
sampler's attr fields read the sampled values."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

NONE = "data_config { dataset_type: ParquetDataset fg_mode: FG_NONE }"
FEATURES = """
feature_configs { raw_feature { feature_name: "age" } }
feature_configs { raw_feature { feature_name: "score" value_dim: 2 } }
feature_configs { raw_feature { feature_name: "level" fg_encoded_default_value: "7" } }
feature_configs { raw_feature { feature_name: "price" } }
feature_configs { id_feature { feature_name: "item" num_buckets: 10 embedding_dim: 4 } }
"""


def _block() -> tuple[pa.Table, pa.Table]:
    """Two rows, then three sampled items (their price and item filled, the rest empty)."""
    rows = pa.table({"age": [20.0, 30.0], "score": [[1.0, 2.0], [3.0, 4.0]],
                     "level": [1.0, 2.0], "price": [5.0, 6.0], "item": [1, 2]})
    sampled = pa.table({"age": pa.nulls(3, pa.float64()),
                        "score": pa.nulls(3, pa.list_(pa.float64())),
                        "level": pa.nulls(3, pa.float64()), "price": [7.0, 8.0, 9.0],
                        "item": [3, 4, 5]})
    return rows, sampled


def test_the_sampled_rows_of_unfilled_dense_features_are_zeros(feature_set):
    rows, sampled = _block()
    batch = feature_set(FEATURES, NONE).parse(rows, with_labels=False, negatives=sampled)
    assert batch.batch_size == 2 and batch.negatives == 3
    assert batch.dense["age"].tolist() == [[20.0], [30.0], [0.0], [0.0], [0.0]]
    assert batch.dense["score"].tolist() == [[1, 2], [3, 4], [0, 0], [0, 0], [0, 0]]
    assert batch.dense["level"].tolist() == [[1.0], [2.0], [7.0], [7.0], [7.0]]
    assert batch.dense["price"].tolist() == [[5.0], [6.0], [7.0], [8.0], [9.0]]
    assert batch.sparse["item"].values.tolist() == [1, 2, 3, 4, 5]
    assert all(t.dtype == torch.float32 for t in batch.dense.values())


def test_an_empty_cell_of_the_batchs_own_rows_is_still_an_error(feature_set):
    from hashrec.features import FeatureError

    rows, sampled = _block()
    rows = rows.set_column(0, "age", pa.array([20.0, None]))
    with pytest.raises(FeatureError, match="'age'.*row 1.*fg_encoded_default_value"):
        feature_set(FEATURES, NONE).parse(rows, with_labels=False, negatives=sampled)

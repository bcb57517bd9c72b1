"""negative_sampler: the item table's formats, weighted draws that avoid the batch's
items, determinism by seed, the sampled rows' columns, and errors naming the problem."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.config.data_pb2 import NegativeSampler as SamplerConfig
from hashrec.data.errors import DataError
from hashrec.data.sampler import NegativeSampler, read_item_table


def _config(path, num_sample=50, **fields) -> SamplerConfig:
    config = SamplerConfig(input_path=str(path), num_sample=num_sample,
                           attr_fields=["item", "cate", "price"], item_id_field="item")
    for name, value in fields.items():
        setattr(config, name, value)
    return config


def _items(tmp_path, weights=(1.0, 1.0, 2.0, 0.0), attrs=None):
    attrs = attrs or [f"{i}:c{i % 2}:{i + 0.5}" for i in range(len(weights))]
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"id": pa.array(range(len(weights)), pa.int64()),
                             "weight": list(weights), "attrs": attrs}), path)
    return path


def _batch(items=(0,)) -> pa.Table:
    return pa.table({"user": pa.array(["u"] * len(items)), "item": pa.array(items, pa.int64()),
                     "cate": pa.array(["c"] * len(items)),
                     "price": pa.array([1.0] * len(items))})


def test_draws_follow_the_weights_and_avoid_the_batchs_items(tmp_path):
    sampler = NegativeSampler(_config(_items(tmp_path), num_sample=3000))
    rows = sampler.draw(np.array([0]), np.random.default_rng(0))
    counts = np.bincount(rows, minlength=4)
    # item 3 weighs 0; item 0 is the batch's: drawn again up to REDRAWS (5) times, a
    # (1/4)^6 share of the draws (about 1 of 3000) keeps it; items 1 and 2 in odds 1 : 2
    assert counts[3] == 0 and counts[0] <= 5
    assert counts[2] / counts[1] == pytest.approx(2.0, rel=0.15)


def test_the_same_seed_draws_the_same_negatives(tmp_path):
    sampler = NegativeSampler(_config(_items(tmp_path)))
    first = sampler.draw(np.array([1]), np.random.default_rng(7))
    assert np.array_equal(first, sampler.draw(np.array([1]), np.random.default_rng(7)))
    assert not np.array_equal(first, sampler.draw(np.array([1]), np.random.default_rng(8)))


def test_a_table_of_only_the_batchs_items_still_fills_the_batch(tmp_path):
    sampler = NegativeSampler(_config(_items(tmp_path, weights=(1.0,)), num_sample=4))
    assert sampler.draw(np.array([0]), np.random.default_rng(0)).tolist() == [0] * 4


def test_sampled_rows_carry_the_attrs_as_the_input_types_and_nulls_elsewhere(tmp_path):
    sampler = NegativeSampler(_config(_items(tmp_path, weights=(0.0, 1.0)), num_sample=2))
    rows = sampler.sample(_batch(), np.random.default_rng(0))
    assert rows.schema == _batch().schema
    assert rows.to_pydict() == {"user": [None, None], "item": [1, 1], "cate": ["c1", "c1"],
                                "price": [1.5, 1.5]}


def test_a_text_item_table_with_a_typed_header_reads_like_parquet(tmp_path):
    path = tmp_path / "items.txt"
    path.write_text("id:int64\tweight:float\tattrs:string\n0\t0\t0:c0:1\n1\t1\t1:c1:2.5\n",
                    encoding="utf-8")
    rows = NegativeSampler(_config(path, num_sample=1)).sample(_batch(),
                                                               np.random.default_rng(0))
    assert rows.column("price").to_pylist() == [2.5]


def test_eval_draws_num_eval_sample_where_set(tmp_path):
    config = _config(_items(tmp_path), num_sample=5, num_eval_sample=3)
    assert NegativeSampler(config, evaluation=True).num_sample == 3
    assert NegativeSampler(config).num_sample == 5


@pytest.mark.parametrize("change, message", [
    ({"num_sample": 0}, r"negative_sampler.num_sample=0; allowed: 1 or more"),
    ({"attrs": ["0:a", "1:b:1", "2:c:2", "3:d:3"]},
     r"items.parquet row 0: attrs '0:a' hold 2 values split on ':'; attr_fields lists 3"),
    ({"weights": (0.0, 0.0)}, r"every item's weight is 0"),
    ({"weights": (1.0, -1.0)}, r"items.parquet row 1: .* weights finite numbers >= 0"),
    ({"input_path": "missing.parquet"}, r"negative_sampler.input_path 'missing.parquet'"),
], ids=["num-sample-0", "attr-count", "zero-weights", "negative-weight", "missing-file"])
def test_bad_settings_and_tables_are_errors_naming_them(tmp_path, change, message):
    weights = change.pop("weights", (1.0, 1.0, 1.0, 1.0))
    path = _items(tmp_path, weights, change.pop("attrs", None))
    config = _config(path, **change)
    with pytest.raises(DataError, match=message):
        NegativeSampler(config)


def test_an_item_table_without_its_columns_names_them(tmp_path):
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"id": [1], "attrs": ["1:a:1"]}), path)
    with pytest.raises(DataError, match="no column weight; it needs id"):
        NegativeSampler(_config(path))


def test_an_input_without_the_item_id_field_names_it(tmp_path):
    sampler = NegativeSampler(_config(_items(tmp_path), item_id_field="adgroup"))
    with pytest.raises(DataError, match="item_id_field 'adgroup' is not a column"):
        sampler.sample(_batch(), np.random.default_rng(0))


def test_samplers_share_a_table_read_once_and_refuse_another_configs(tmp_path):
    config = _config(_items(tmp_path), num_sample=5, num_eval_sample=3)
    items = read_item_table(config)
    train, evaluation = NegativeSampler(config, items=items), \
        NegativeSampler(config, evaluation=True, items=items)
    assert train.ids is evaluation.ids is items.ids
    assert (train.num_sample, evaluation.num_sample) == (5, 3)
    with pytest.raises(ValueError, match="not from this sampler's"):
        NegativeSampler(_config(tmp_path / "other.parquet"), items=items)

"""negative_sampler_v2, hard_negative_sampler and hard_negative_sampler_v2 on hand-built
tables: V2 never draws a positive of the row's user, hard negatives are the user's hard
edges (up to num_hard_sample, in fixed slots with a mask), counts, determinism, the
tables' formats and errors naming the field."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.config import ConfigError, parse_pipeline_config, validate_pipeline_config
from hashrec.config.data_pb2 import (
    DataConfig,
    HardNegativeSampler,
    HardNegativeSamplerV2,
    NegativeSamplerV2,
)
from hashrec.data.edge_sampler import EdgeNegativeSampler, Negatives, read_sampler_tables
from hashrec.data.errors import DataError
from hashrec.data.sampler import negative_items, negative_sampler

ITEMS = 10  # items 1..10, attrs "<id>:<id * 100>"


def _tables(tmp_path, positives=(), hard=()) -> dict[str, str]:
    ids = np.arange(1, ITEMS + 1)
    pq.write_table(pa.table({"id": ids, "weight": np.ones(ITEMS),
                             "attrs": [f"{i}:{i * 100}" for i in ids]}), tmp_path / "items.parquet")
    pq.write_table(pa.table({"id": [7, 8, 9], "weight": [1.0, 1.0, 1.0]}),
                   tmp_path / "users.parquet")
    paths = {"user_input_path": str(tmp_path / "users.parquet"),
             "item_input_path": str(tmp_path / "items.parquet")}
    for name, edges in (("pos_edge_input_path", positives),
                        ("hard_neg_edge_input_path", hard)):
        src = [u for u, _ in edges]
        dst = [i for _, i in edges]
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"src_id": pa.array(src, pa.int64()),
                                 "dst_id": pa.array(dst, pa.int64()),
                                 "weight": np.ones(len(src))}), path)
        paths[name] = str(path)
    return paths


def _config(kind, paths, **fields):
    config = kind(**{k: v for k, v in paths.items() if k in kind.DESCRIPTOR.fields_by_name})
    config.num_sample = fields.pop("num_sample", 4)
    config.attr_fields.extend(["item", "price"])
    config.item_id_field = "item"
    config.user_id_field = "user"
    if "num_hard_sample" in kind.DESCRIPTOR.fields_by_name:
        config.num_hard_sample = fields.pop("num_hard_sample", 2)
    for name, value in fields.items():
        setattr(config, name, value)
    return config


def _batch(users, items=None) -> pa.Table:
    items = items if items is not None else [1] * len(users)
    return pa.table({"user": pa.array(users, pa.int64()), "item": pa.array(items, pa.int64()),
                     "price": pa.array([1.0] * len(users)), "clk": [1.0] * len(users)})


def _items_of(table: pa.Table) -> list:
    return table.column("item").to_pylist()


def test_v2_never_draws_a_positive_of_the_rows_user(tmp_path):
    # user 7 has positive edges to items 1..9: only item 10 is left to draw for its rows
    # (most draws need the draw from outside the positives after the redraws)
    paths = _tables(tmp_path, positives=[(7, i) for i in range(1, 10)] + [(9, 99)])
    sampler = EdgeNegativeSampler(_config(NegativeSamplerV2, paths, num_sample=400))
    drawn = sampler.sample(_batch([7, 8]), np.random.default_rng(0))
    assert isinstance(drawn, pa.Table) and drawn.num_rows == 400
    items = np.array(_items_of(drawn))
    # the k-th negative is drawn for row k // ceil(400 / 2)
    assert set(items[:200]) == {10}
    assert len(set(items[200:])) == ITEMS  # user 8 has no positive edges
    np.testing.assert_array_equal(drawn.column("price").to_numpy()[:200], 1000.0)
    assert drawn.column("user").null_count == 400 and drawn.column("clk").null_count == 400


def test_v2_refuses_a_user_positive_to_every_item(tmp_path):
    paths = _tables(tmp_path, positives=[(7, i) for i in range(1, ITEMS + 1)])
    sampler = EdgeNegativeSampler(_config(NegativeSamplerV2, paths))
    with pytest.raises(DataError, match="negative_sampler_v2: user 7 has a positive edge to "
                                        "every item"):
        sampler.sample(_batch([7]), np.random.default_rng(0))


def test_hard_negatives_are_the_users_hard_edges_in_fixed_slots(tmp_path):
    paths = _tables(tmp_path, hard=[(7, 3), (9, 2), (7, 5), (7, 6)])
    sampler = EdgeNegativeSampler(_config(HardNegativeSampler, paths, num_sample=4,
                                          num_hard_sample=3))
    drawn = sampler.sample(_batch([7, 9, 11, None]), np.random.default_rng(0))
    assert isinstance(drawn, Negatives)
    assert drawn.negatives.num_rows == 4 + 4 * 3
    np.testing.assert_array_equal(drawn.hard, [[True] * 3, [True, False, False],
                                               [False] * 3, [False] * 3])
    hard = _items_of(drawn.negatives)[4:]
    assert hard == [3, 5, 6, 2] + [None] * 8  # an unknown or missing user: none
    assert drawn.negatives.column("price").to_pylist()[4:8] == [300.0, 500.0, 600.0, 200.0]
    # hard_negative_sampler's shared negatives avoid the batch's items, as negative_sampler's
    assert 1 not in _items_of(drawn.negatives)[:4]


def test_a_user_with_more_hard_edges_gets_num_hard_sample_of_them(tmp_path):
    paths = _tables(tmp_path, hard=[(7, i) for i in range(2, 9)])
    sampler = EdgeNegativeSampler(_config(HardNegativeSampler, paths, num_hard_sample=2))
    seen = set()
    for seed in range(20):
        drawn = sampler.sample(_batch([7]), np.random.default_rng(seed))
        hard = _items_of(drawn.negatives)[4:]
        assert drawn.hard.tolist() == [[True, True]]
        assert len(set(hard)) == 2 and set(hard) <= set(range(2, 9)) and hard == sorted(hard)
        seen.update(hard)
    assert seen == set(range(2, 9))


def test_hard_negative_sampler_v2_avoids_positives_and_adds_hard_edges(tmp_path):
    paths = _tables(tmp_path, positives=[(7, i) for i in range(1, 9)], hard=[(7, 4)])
    sampler = EdgeNegativeSampler(_config(HardNegativeSamplerV2, paths, num_sample=50,
                                          num_hard_sample=1))
    drawn = sampler.sample(_batch([7]), np.random.default_rng(3))
    items = _items_of(drawn.negatives)
    assert set(items[:50]) == {9, 10} and items[50:] == [4]
    assert drawn.hard.tolist() == [[True]]


@pytest.mark.parametrize("kind", [NegativeSamplerV2, HardNegativeSampler,
                                  HardNegativeSamplerV2],
                         ids=["v2", "hard", "hard-v2"])
def test_the_same_seed_draws_the_same_negatives(tmp_path, kind):
    paths = _tables(tmp_path, positives=[(7, 1), (8, 2)], hard=[(7, i) for i in range(3, 9)])
    sampler = EdgeNegativeSampler(_config(kind, paths, num_sample=8))
    draws = [sampler.sample(_batch([7, 8, 7]), np.random.default_rng(seed))
             for seed in (5, 5, 6)]
    tables = [d if isinstance(d, pa.Table) else d.negatives for d in draws]
    assert tables[0].equals(tables[1]) and not tables[0].equals(tables[2])


def test_evaluation_draws_num_eval_sample(tmp_path):
    paths = _tables(tmp_path, hard=[(7, 3)])
    config = _config(HardNegativeSampler, paths, num_sample=4, num_eval_sample=6)
    drawn = EdgeNegativeSampler(config, evaluation=True).sample(_batch([7, 8]),
                                                                np.random.default_rng(0))
    assert drawn.negatives.num_rows == 6 + 2 * 2


def test_text_tables_with_typed_headers(tmp_path):
    (tmp_path / "items.txt").write_text("id:int64\tweight:float\tattrs:string\n"
                                        "1\t1.0\t1:100\n2\t1.0\t2:200\n")
    (tmp_path / "users.txt").write_text("id:int64\tweight:float\n7\t1.0\n")
    (tmp_path / "hard.txt").write_text("src_id:int64\tdst_id:int64\tweight:float\n7\t2\t1.0\n")
    config = _config(HardNegativeSampler, {"user_input_path": str(tmp_path / "users.txt"),
                                           "item_input_path": str(tmp_path / "items.txt"),
                                           "hard_neg_edge_input_path":
                                               str(tmp_path / "hard.txt")},
                     num_hard_sample=1)
    drawn = EdgeNegativeSampler(config).sample(_batch([7]), np.random.default_rng(0))
    assert _items_of(drawn.negatives) == [2, 2, 2, 2, 2]


def test_the_samplers_of_a_run_share_one_read(tmp_path):
    paths = _tables(tmp_path, positives=[(7, 1)])
    data = DataConfig(negative_sampler_v2=_config(NegativeSamplerV2, paths))
    tables = negative_items(data)
    train, evaluate = negative_sampler(data, "train", tables), negative_sampler(data, "eval",
                                                                                tables)
    assert train.positives is evaluate.positives is tables.positives
    assert negative_sampler(data, "predict", tables) is None
    other = _config(NegativeSamplerV2, paths, attr_delimiter="|")
    with pytest.raises(ValueError, match="tables read from"):
        EdgeNegativeSampler(other, tables=tables)


@pytest.mark.parametrize("change, message", [
    ({"user_input_path": "missing.parquet"},
     r"hard_negative_sampler_v2.user_input_path 'missing.parquet'"),
    ({"hard_neg_edge_input_path": ""}, r"hard_negative_sampler_v2.hard_neg_edge_input_path "
                                       r"is empty"),
    ({"num_hard_sample": 0}, r"hard_negative_sampler_v2.num_hard_sample=0; allowed: 1 or "
                             r"more"),
    ({"user_id_field": ""}, r"hard_negative_sampler_v2.user_id_field is empty"),
])
def test_bad_settings_name_the_field(tmp_path, change, message):
    paths = _tables(tmp_path, positives=[(7, 1)], hard=[(7, 2)])
    config = _config(HardNegativeSamplerV2, paths)
    for name, value in change.items():
        setattr(config, name, value)
    with pytest.raises(DataError, match=message):
        EdgeNegativeSampler(config)


def test_bad_tables_name_the_file(tmp_path):
    paths = _tables(tmp_path, hard=[(7, 42)])
    with pytest.raises(DataError, match=r"hard_negative_sampler.hard_neg_edge_input_path: "
                                        r"the edge of user 7 to item 42 .* not in the item "
                                        r"table"):
        read_sampler_tables(_config(HardNegativeSampler, paths))
    pq.write_table(pa.table({"user": [7], "item": [1]}), tmp_path / "bad.parquet")
    paths["hard_neg_edge_input_path"] = str(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"hard_neg_edge_input_path edge table .*bad.parquet: no "
                                        r"column src_id, dst_id"):
        read_sampler_tables(_config(HardNegativeSampler, paths))
    sampler = EdgeNegativeSampler(_config(NegativeSamplerV2, _tables(tmp_path)))
    with pytest.raises(DataError, match=r"negative_sampler_v2.user_id_field 'user' is not a "
                                        r"column"):
        sampler.sample(pa.table({"item": [1]}), np.random.default_rng(0))


_MODEL = """
feature_configs {{ id_feature {{ feature_name: "u" expression: "user:u" num_buckets: 5
  embedding_dim: 4 }} }}
feature_configs {{ id_feature {{ feature_name: "i" expression: "item:i" num_buckets: 5
  embedding_dim: 4 }} }}
data_config {{ dataset_type: ParquetDataset label_fields: "clk" {sampler} {{
  user_input_path: "u" item_input_path: "i" pos_edge_input_path: "p"
  hard_neg_edge_input_path: "h" num_sample: 2 num_hard_sample: 1 attr_fields: "i"
  item_id_field: "i" user_id_field: "u" }} }}
model_config {{
  feature_groups {{ group_name: "user" feature_names: "u" group_type: DEEP }}
  feature_groups {{ group_name: "item" feature_names: "i" group_type: DEEP }}
  {model}
}}
"""
_DSSM = ('dssm { user_tower { input: "user" mlp { hidden_units: [4] } } item_tower { '
         'input: "item" mlp { hidden_units: [4] } } output_dim: 4 } '
         'losses { softmax_cross_entropy {} }')
_RANKING = ('multi_tower { towers { input: "user" mlp { hidden_units: [4] } } towers { '
            'input: "item" mlp { hidden_units: [4] } } }')


@pytest.mark.parametrize("sampler", ["hard_negative_sampler_v2", "hard_negative_sampler"])
def test_a_match_model_takes_the_samplers_and_a_ranking_model_refuses_them(sampler):
    def config(model):
        text = _MODEL.format(sampler=sampler, model=model)
        if sampler == "hard_negative_sampler":
            text = text.replace('pos_edge_input_path: "p"', "")
        return parse_pipeline_config('model_dir: "m"\n' + text)

    validate_pipeline_config(config(_DSSM))
    with pytest.raises(ConfigError, match=f"data_config.{sampler} feeds a match model's item "
                                          f"tower; model_config.multi_tower does not read it"):
        validate_pipeline_config(config(_RANKING))

"""tdm_sampler: a row's ancestors as positives, same-level negatives that avoid the row's
node, kept levels, determinism by seed, and errors naming the field, on hand-built trees
whose node id is its code (root 0; the children of c: 2c + 1, 2c + 2)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from hashrec.config.data_pb2 import DataConfig
from hashrec.config.data_pb2 import TDMSampler as SamplerConfig
from hashrec.data import tdm_sampler as module
from hashrec.data.errors import DataError
from hashrec.data.sampler import negative_items, negative_sampler
from hashrec.data.tdm_sampler import TDMSampler, keep_odds


def _level(code: int) -> int:
    return int(math.log2(code + 1))


def _tree(tmp_path, levels=4, weight=lambda code: 1.0):
    """A complete binary tree of ``levels`` levels in TorchEasyRec's text tables."""
    nodes = tmp_path / "node_table.txt"
    count = 2 ** levels - 1
    with open(nodes, "w") as f:
        f.write("id:int64\tweight:float\tfeature:string\n")
        f.write("-1\t1.0\t-1,0,c0\n")  # GraphLearn's root handle: skipped
        for code in range(count):
            f.write(f"{code}\t{weight(code)}\t{_level(code)},{code},c{code % 3}\n")
    edges = tmp_path / "edge_table.txt"
    with open(edges, "w") as f:
        f.write("src_id:int64\tdst_id:int64\tweight:float\n")
        for leaf in range(2 ** (levels - 1) - 1, count):
            code = (leaf - 1) // 2
            while code > 0:
                f.write(f"{leaf}\t{code}\t1.0\n")
                code = (code - 1) // 2
    return nodes, edges


def _config(tmp_path, layer_num_sample=(0, 1, 2, 3), levels=4, **fields) -> SamplerConfig:
    nodes, edges = _tree(tmp_path, levels, fields.pop("weight", lambda code: 1.0))
    config = SamplerConfig(item_input_path=str(nodes), edge_input_path=str(edges),
                           predict_edge_input_path=str(edges),
                           attr_fields=["tree_level", "item", "cate"], item_id_field="item",
                           layer_num_sample=list(layer_num_sample), attr_delimiter=",")
    for name, value in fields.items():
        if isinstance(value, list):
            config.ClearField(name)
            getattr(config, name).extend(value)
        else:
            setattr(config, name, value)
    return config


def _block(items=(7, 12)) -> pa.Table:
    return pa.table({"user": pa.array([f"u{i}" for i in range(len(items))]),
                     "item": pa.array(items, pa.int64()),
                     "cate": pa.array(["x"] * len(items)),
                     "label": pa.array([1] * len(items), pa.int32())})


def test_rows_are_the_block_then_ancestors_then_negatives_per_user(tmp_path):
    sampler = TDMSampler(_config(tmp_path), ["label"])
    out = sampler.expand(_block(), np.random.default_rng(0))
    assert out.schema == _block().schema
    items = out.column("item").to_pylist()
    users = out.column("user").to_pylist()
    labels = out.column("label").to_pylist()
    # 2 rows, 2 x 2 ancestors (levels 1, 2), 2 x (1 + 2 + 3) negatives
    assert len(items) == 2 + 4 + 12
    assert items[:2] == [7, 12] and labels[:2] == [1, 1]
    assert items[2:6] == [1, 3, 2, 5]  # leaf 7: 1, 3; leaf 12: 2, 5 (root first)
    assert users[2:6] == ["u0", "u0", "u1", "u1"] and labels[2:6] == [1, 1, 1, 1]
    assert labels[6:] == [0] * 12 and users[6:] == ["u0"] * 6 + ["u1"] * 6
    # the node's cate replaces the row's; the user column is the row's
    assert out.column("cate").to_pylist()[2:4] == ["c1", "c0"]
    own = {"u0": [1, 3, 7], "u1": [2, 5, 12]}
    for user, start in (("u0", 6), ("u1", 12)):
        negatives = items[start:start + 6]
        assert [_level(c) for c in negatives] == [1, 2, 2, 3, 3, 3]
        for level, group in ((1, negatives[:1]), (2, negatives[1:3]), (3, negatives[3:])):
            assert own[user][level - 1] not in group
            assert len(set(group)) == len(group)  # distinct within a row and level


def test_the_same_seed_gives_the_same_rows(tmp_path):
    sampler = TDMSampler(_config(tmp_path, (0, 1, 2, 5)), ["label"])
    block = _block((7, 8, 9, 10, 11, 12, 13, 14))
    first = sampler.expand(block, np.random.default_rng(3))
    assert first.equals(sampler.expand(block, np.random.default_rng(3)))
    assert not first.equals(sampler.expand(block, np.random.default_rng(4)))


def test_negatives_follow_the_weights(tmp_path):
    # leaves 7..14: 13 weighs 0, 14 weighs 3; every other leaf 1
    weights = {13: 0.0, 14: 3.0}
    sampler = TDMSampler(_config(tmp_path, (0, 0, 0, 1),
                                 weight=lambda code: weights.get(code, 1.0)), ["label"])
    out = sampler.expand(_block((7,) * 4000), np.random.default_rng(0))
    drawn = np.array(out.column("item").to_pylist()[4000 + 2 * 4000:])
    counts = np.bincount(drawn, minlength=15)
    assert counts[13] == 0 and counts[7] == 0  # weight 0; the row's own leaf
    assert counts[14] / counts[8] == pytest.approx(3.0, rel=0.15)


def test_large_levels_draw_independently_and_avoid_the_rows_node(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "EXACT_DRAW_CELLS", 0)
    sampler = TDMSampler(_config(tmp_path, (0, 1, 3, 7)), ["label"])
    out = sampler.expand(_block((7,) * 50), np.random.default_rng(0))
    negatives = np.array(out.column("item").to_pylist()[50 + 100:]).reshape(50, 11)
    assert (negatives[:, 0] == 2).all()  # level 1 holds 1 and 2: never the own 1
    assert np.isin(negatives[:, 1:4], [4, 5, 6]).all()
    assert np.isin(negatives[:, 4:], [8, 9, 10, 11, 12, 13, 14]).all()


def test_remain_ratio_keeps_some_middle_levels(tmp_path):
    config = _config(tmp_path, (0, 1, 1, 1, 2), levels=5, remain_ratio=0.34,
                     probability_type="RECIPROCAL")
    sampler = TDMSampler(config, ["label"])
    rng = np.random.default_rng(0)
    kept = [sampler.kept_levels(rng).tolist() for _ in range(3000)]
    assert all(len(k) == 1 for k in kept)  # round(0.34 * 3) of levels 1, 2, 3
    shares = np.bincount([k[0] for k in kept], minlength=4)[1:] / 3000
    assert shares == pytest.approx(keep_odds("RECIPROCAL", 5), abs=0.04)
    out = sampler.expand(_block((15, 20)), np.random.default_rng(1))
    # per row: 1 ancestor, 1 negative of its level and 2 leaves
    assert out.num_rows == 2 + 2 + 2 * 3
    assert out.column("label").to_pylist()[2:] == [1, 1] + [0] * 6


def test_keep_odds():
    assert keep_odds("UNIFORM", 5).tolist() == pytest.approx([1 / 3] * 3)
    assert keep_odds("ARITHMETIC", 5).tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    assert keep_odds("RECIPROCAL", 5).tolist() == pytest.approx(
        np.array([1 / 3, 1 / 2, 1]) / (1 / 3 + 1 / 2 + 1))


def test_data_config_builds_it_for_train_and_eval_only(tmp_path):
    data_config = DataConfig(label_fields=["label"])
    data_config.tdm_sampler.CopyFrom(_config(tmp_path))
    tree = negative_items(data_config)
    assert isinstance(negative_sampler(data_config, "train", tree), TDMSampler)
    assert isinstance(negative_sampler(data_config, "eval", tree), TDMSampler)
    assert negative_sampler(data_config, "predict", tree) is None


@pytest.mark.parametrize("fields,match", [
    ({"attr_fields": ["item", "tree_level", "cate"]}, "attr_fields"),
    ({"layer_num_sample": [0, 1, 2]}, "layer_num_sample has 3 entries"),
    ({"layer_num_sample": [1, 1, 2, 3]}, "layer_num_sample"),
    ({"remain_ratio": 0.0}, "remain_ratio"),
    ({"probability_type": "GEOMETRIC"}, "probability_type"),
    ({"item_id_field": ""}, "item_id_field"),
    ({"attr_delimiter": ":"}, "attr_fields lists 3"),
])
def test_config_errors_name_the_field(tmp_path, fields, match):
    with pytest.raises(DataError, match=match):
        TDMSampler(_config(tmp_path, **fields), ["label"])


def test_an_item_that_is_no_leaf_is_named(tmp_path):
    sampler = TDMSampler(_config(tmp_path), ["label"])
    with pytest.raises(DataError, match="item 3 is not a leaf"):
        sampler.expand(_block((7, 3)), np.random.default_rng(0))


def test_a_level_without_another_node_to_draw_is_refused(tmp_path):
    # level 1 holds nodes 1 and 2; node 2 weighs 0
    with pytest.raises(DataError, match=r"layer_num_sample\[1\]"):
        TDMSampler(_config(tmp_path, weight=lambda code: 0.0 if code == 2 else 1.0),
                   ["label"])

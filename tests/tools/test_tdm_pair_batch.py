"""The retrieval's (user, node) pairs gathered from the user rows and the nodes, each parsed
once, against the parse of the pairs' table (how the retrieval built them before), on
random pairs over features of every layout: ids, weighted ids, multi-value sequences,
dense and sequence raw values, missing node attrs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from hashrec.config import parse_pipeline_config
from hashrec.features import build_feature_set
from hashrec.tools.tdm.pair_batch import feature_sides
from hashrec.tools.tdm.retrieval import PairScorer
from hashrec.tools.tdm.search_tree import build_search_tree

NODES, USERS = 40, 12


def _id(name: str, side: str, options: str = "") -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: '
            f'"{side}:{name}" embedding_dim: 4 hash_bucket_size: 1000 {options} }} }}\n')


FEATURES = (
    _id("user_id", "user") + _id("item_id", "item") + _id("cate", "item")
    + _id("kw", "user", 'weighted: true separator: ","')
    + 'feature_configs { raw_feature { feature_name: "age" expression: "user:age" '
      'value_dim: 2 separator: "," } }\n'
    + 'feature_configs { raw_feature { feature_name: "price" expression: "item:price" } }\n'
    + 'feature_configs { sequence_feature { sequence_name: "seq" sequence_length: 4 '
      'sequence_delim: ";" features { id_feature { feature_name: "item_id" expression: '
      '"item:item_id" embedding_dim: 4 num_buckets: 100 value_dim: 0 } } features { '
      'raw_feature { feature_name: "price" expression: "item:price" } } } }\n')
COMBO = ('feature_configs { combo_feature { feature_name: "x" expression: ["user:user_id", '
         '"item:cate"] embedding_dim: 4 hash_bucket_size: 50 } }\n')


def _tree(rng):
    """A root and NODES - 1 leaves, with item_id, cate (some missing) and price attrs."""
    ids = np.arange(NODES, dtype=np.int64) + 500
    levels = np.array([0] + [1] * (NODES - 1), dtype=np.int64)
    attrs = {"item_id": pa.array([str(i) for i in ids]),
             "cate": pa.array([str(c) if c else "" for c in rng.integers(0, 5, NODES)]),
             "price": pa.array([f"{p:.3f}" for p in rng.random(NODES)])}
    return build_search_tree(ids, levels, attrs, np.full(NODES - 1, 500), ids[1:])


def _users(rng) -> pa.Table:
    def seq(count):
        return ";".join("\x1d".join(str(v) for v in rng.integers(0, 99, rng.integers(1, 3)))
                        for _ in range(count))

    return pa.table({
        "user_id": [f"u{i}" for i in range(USERS)],
        "item_id": [str(i) for i in rng.integers(0, 99, USERS)],
        "cate": [str(c) for c in rng.integers(0, 5, USERS)],
        "kw": [",".join(f"k{k}:{w:.2f}" for k, w in zip(rng.integers(0, 9, n), rng.random(n)))
               for n in rng.integers(0, 4, USERS)],
        "age": [f"{a},{a + 1}" for a in rng.integers(10, 60, USERS)],
        "price": rng.random(USERS),
        "seq__item_id": [seq(n) for n in rng.integers(0, 6, USERS)],
        "seq__price": [None] * USERS})


def _pairs(features: str, seed: int):
    """(gathered Batch, parsed Batch, feature set) of random pairs."""
    rng = np.random.default_rng(seed)
    feature_set = build_feature_set(parse_pipeline_config(f'model_dir: "m"\n{features}'))
    users, tree = _users(rng), _tree(rng)
    users = users.set_column(users.schema.get_field_index("seq__price"), "seq__price",
                             pa.array([";".join(f"{p:.2f}" for p in rng.random(
                                 len(s.split(";")) if s else 0)) for s in
                                 users["seq__item_id"].to_pylist()]))
    users = users.select(feature_set.feature_columns)
    gathered = []
    scorer = PairScorer(feature_set, lambda batch: gathered.append(batch) or torch.zeros(0),
                        tree, torch.device("cpu"))
    pairs = 300
    user_index = torch.from_numpy(rng.integers(0, USERS, pairs))
    node_rows = torch.from_numpy(rng.integers(0, NODES, pairs))
    scorer.for_users(users)(user_index, node_rows)
    parsed = feature_set.parse(scorer.pairs_table(users, user_index, node_rows),
                               with_labels=False)
    return gathered[0], parsed, feature_set


def _assert_same(got, want):
    assert got.batch_size == want.batch_size
    assert got.sparse.keys() == want.sparse.keys()
    assert torch.equal(got.sparse.values(), want.sparse.values())
    assert torch.equal(got.sparse.lengths(), want.sparse.lengths())
    assert torch.equal(got.sparse.weights(), want.sparse.weights())
    assert got.sparse.host_layout() == want.sparse.host_layout()
    for mine, theirs in ((got.dense, want.dense), (got.sequence_dense, want.sequence_dense)):
        assert list(mine) == list(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gathered_pairs_equal_the_parsed_pairs(seed):
    gathered, parsed, feature_set = _pairs(FEATURES, seed)
    # every layout is there: weights, multi-value item sizes, dense and sequence values
    assert "seq__item_id#items" in parsed.sparse.keys()
    assert set(parsed.dense) == {"age", "price"} and set(parsed.sequence_dense) == \
        {"seq__price"}
    assert feature_sides(feature_set, {"item_id", "cate", "price"}) == \
        (["user_id", "kw", "age", "seq__item_id", "seq__price"], ["item_id", "cate", "price"])
    _assert_same(gathered, parsed)


def test_a_feature_of_both_sides_parses_the_pairs_table():
    gathered, parsed, feature_set = _pairs(FEATURES + COMBO, 3)
    assert feature_sides(feature_set, {"item_id", "cate", "price"}) is None
    _assert_same(gathered, parsed)

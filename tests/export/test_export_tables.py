"""Logical table views of a collection and one rank's part written from them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hashrec.embedding.collection import EmbeddingCollection
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.embedding.zch import ZchOptions
from hashrec.export.errors import ExportError
from hashrec.export.part_writer import PartContents, write_part
from hashrec.export.scripted.build import load_hashmaps
from hashrec.export.tables import dense_table_weights, dynamic_table_views
from hashrec.table import InitializerArgs, TableOptions
from hashrec.table.hashing import owner_of
from hashrec.table.optim import SparseAdam


def fused_collection(eval_initializer: InitializerArgs | None = None) -> EmbeddingCollection:
    options = TableOptions(dim=3, max_capacity=128, bucket_capacity=16,
                           eval_initializer=eval_initializer or InitializerArgs(
                               mode="CONSTANT", value=0.0))
    tables = [EmbeddingTableSpec("a", 3, dynamic=options, fusion_group="g"),
              EmbeddingTableSpec("b", 3, dynamic=options, fusion_group="g"),
              EmbeddingTableSpec("d", 3, num_rows=5)]
    features = [EmbeddingFeatureSpec("fa", "a"), EmbeddingFeatureSpec("fb", "b"),
                EmbeddingFeatureSpec("fd", "d")]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.1))


def fill(ec: EmbeddingCollection) -> None:
    storage = ec.dynamic_tables()["g"]
    keys = torch.tensor([5, 6, 7, 5, 9], dtype=torch.int64)
    tags = torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32)
    storage.insert_or_assign(keys, torch.arange(15.0).view(5, 3), tags=tags)


def test_fused_storage_splits_into_logical_tables_without_optimizer_state(tmp_path):
    ec = fused_collection()
    fill(ec)
    contents = PartContents({}, dense_table_weights(ec), dynamic_table_views(ec))
    entries = write_part(str(tmp_path), contents, rank=1, world_size=2, chunk_rows=2)
    tensors = load_file(str(tmp_path / "model-000001-of-000002.safetensors"))
    assert entries["a"]["shape"] == [3, 3] and entries["b"]["shape"] == [2, 3]
    keys_b = tensors["b.keys/part_1_2"]
    values_b = tensors["b.values/part_1_2"]
    order = keys_b.argsort()
    assert keys_b[order].tolist() == [5, 9]
    assert values_b[order].tolist() == [[9.0, 10.0, 11.0], [12.0, 13.0, 14.0]]
    assert tensors["d.weight"].shape == (5, 3)
    assert torch.equal(tensors["d.weight"], ec.dense_tables["d"].rows[:, :3])
    with open(tmp_path / "model-000001-of-000002.json", encoding="utf-8") as f:
        assert json.load(f) == entries
    assert entries["d"] == {"name": "d.weight", "dense": False, "dimension": 3,
                            "dtype": "float32", "shape": [5, 3], "is_hashmap": False}


def test_random_eval_initializer_cannot_be_exported():
    ec = fused_collection(InitializerArgs(mode="NORMAL", std_dev=0.1))
    with pytest.raises(ExportError, match="table 'a': eval_initializer mode NORMAL"):
        dynamic_table_views(ec)[0].missing_value()


def test_parts_of_several_ranks_hold_each_zch_id_once(tmp_path):
    # Every rank holds the whole replicated ZCH table; its parts split the ids by owner.
    ec = EmbeddingCollection([EmbeddingTableSpec("z", 2, num_rows=16,
                                                 zch=ZchOptions(zch_size=16))],
                             [EmbeddingFeatureSpec("fz", "z")], SparseAdam(lr=0.1))
    ids = torch.arange(100, 112, dtype=torch.int64)
    ec(KeyedJaggedTensor.from_lengths(["fz"], ids, torch.ones(12, dtype=torch.int64)))
    assigned, slots, _, _ = ec.zch_remappers["z"].assigned()
    assert assigned.numel() == 12
    for rank in range(2):
        views = dynamic_table_views(ec, rank=rank, world_size=2)
        entries = write_part(str(tmp_path), PartContents({}, {}, views), rank, 2)
        owned = int((owner_of(assigned, 2) == rank).sum())
        assert 0 < owned < 12 and entries["z"]["shape"] == [owned, 2]
    keys, values = load_hashmaps(str(tmp_path), 2, ["z"])["z"]
    order = assigned.argsort()
    assert torch.equal(keys, assigned[order])
    assert torch.equal(values, ec.dense_tables["z"].rows[slots[order], :2])

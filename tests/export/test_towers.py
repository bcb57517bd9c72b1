"""A match model's towers exported apart (``<export_dir>/user``, ``/item``): each embeds as
the whole model does, from its own columns alone, holds its own tables only, and every
mix-up is an error naming what is wrong."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config
from hashrec.data import DataError
from hashrec.export import ExportError
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate

USERS, ITEMS = 3000, 64


def _rows(count: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    items = rng.integers(0, ITEMS, count)
    return pa.table({"user_id": rng.permutation(USERS)[:count] if count <= USERS
                     else rng.integers(0, USERS, count),
                     "age": rng.uniform(10, 60, count),
                     "adgroup_id": items, "cate_id": items % 7, "clk": np.ones(count)})


def _config(tmp_path) -> str:
    dynamic = 'dynamicemb { max_capacity: 8192 initializer_args { mode: "NORMAL" ' \
              'std_dev: 0.1 } }'
    return f"""
train_input_path: "{tmp_path}/train.parquet"
eval_input_path: "{tmp_path}/eval.parquet"
model_dir: "{tmp_path}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 1
}}
data_config {{ batch_size: 256 dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 16 {dynamic} }} }}
feature_configs {{ raw_feature {{ feature_name: "age" expression: "user:age" }} }}
feature_configs {{ id_feature {{ feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 16 {dynamic} }} }}
feature_configs {{ id_feature {{ feature_name: "cate_id" expression: "item:cate_id"
  num_buckets: 7 embedding_dim: 4 }} }}
model_config {{
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id"
    feature_names: "age" }}
  feature_groups {{ group_name: "item" group_type: DEEP feature_names: "adgroup_id"
    feature_names: "cate_id" }}
  dssm {{ user_tower {{ input: "user" mlp {{ hidden_units: [16] }} }}
          item_tower {{ input: "item" mlp {{ hidden_units: [16] }} }}
          output_dim: 8 similarity: INNER_PRODUCT temperature: 0.5 in_batch_negative: true }}
  metrics {{ recall_at_k {{ top_k: 5 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(tmp dir, export dir) of a DSSM trained one epoch on 3000 users and 64 items."""
    tmp_path = tmp_path_factory.mktemp("towers")
    pq.write_table(_rows(USERS, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(300, 1), tmp_path / "eval.parquet")
    config = parse_pipeline_config(_config(tmp_path))
    train_and_evaluate(config)
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "model")))
    return tmp_path, export


def _embeddings(path, column: str) -> torch.Tensor:
    return torch.tensor(pq.read_table(path)[column].to_pylist())


def test_each_tower_embeds_from_its_own_columns_as_the_whole_model_does(exported):
    tmp_path, export = exported
    both = pq.read_table(tmp_path / "eval.parquet")
    pq.write_table(both.select(["user_id", "age"]), tmp_path / "users.parquet")
    pq.write_table(both.select(["adgroup_id", "cate_id"]), tmp_path / "items.parquet")
    predict(str(export), str(tmp_path / "eval.parquet"), str(tmp_path / "whole.parquet"))
    predict(str(export / "user"), str(tmp_path / "users.parquet"),
            str(tmp_path / "user.parquet"), reserved_columns=("user_id",))
    predict(str(export / "item"), str(tmp_path / "items.parquet"),
            str(tmp_path / "item.parquet"))
    user = pq.read_table(tmp_path / "user.parquet")
    assert user.column_names == ["user_tower_emb", "user_id"]
    assert user["user_id"].to_pylist() == both["user_id"].to_pylist()
    assert pq.read_table(tmp_path / "item.parquet").column_names == ["item_tower_emb"]
    for tower in ("user", "item"):
        alone = _embeddings(tmp_path / f"{tower}.parquet", f"{tower}_tower_emb")
        whole = _embeddings(tmp_path / "whole.parquet", f"{tower}_tower_emb")
        assert alone.shape == (300, 8) and alone.abs().sum() > 0
        torch.testing.assert_close(alone, whole, rtol=0, atol=0)


def test_a_tower_export_holds_its_own_tables_only_and_says_which_tower(exported):
    _, export = exported
    metas = {t: json.loads((export / t / "tower.json").read_text()) for t in ("user", "item")}
    assert metas["user"]["tower"] == "user" and metas["item"]["tower"] == "item"
    assert metas["user"]["tables"] == ["user_id"]
    assert sorted(metas["item"]["tables"]) == ["adgroup_id", "cate_id"]
    assert metas["user"]["input_columns"] == ["user_id", "age"]
    assert metas["item"]["output"] == "item_tower_emb" and metas["item"]["dimension"] == 8
    assert sorted(os.listdir(export / "item")) == ["pipeline.config", "scripted_model.pt",
                                                     "tower.json"]
    for tower, tables in (("user", ["user_id"]), ("item", ["adgroup_id", "cate_id"])):
        model = torch.jit.load(str(export / tower / "scripted_model.pt"))
        assert model.tower == tower
        assert sorted(t.name for _, t in model.embedding.tables.named_children()) == tables
    # The user id table (about 3000 rows of 16 floats and their keys) is the item
    # export's several times over.
    item_bytes = os.path.getsize(export / "item" / "scripted_model.pt")
    user_bytes = os.path.getsize(export / "user" / "scripted_model.pt")
    assert user_bytes > 3000 * (16 * 4 + 8) > 4 * item_bytes


def test_a_tower_export_names_the_columns_it_lacks_and_what_it_gives(exported):
    tmp_path, export = exported
    items_only = tmp_path / "items_only.parquet"
    pq.write_table(pq.read_table(tmp_path / "eval.parquet").select(["adgroup_id", "cate_id"]),
                   items_only)
    with pytest.raises(DataError, match=r"column 'user_id' is missing.*embeds the user "
                                        r"tower alone.*'user_id', 'age'"):
        predict(str(export / "user"), str(items_only), str(tmp_path / "out1.parquet"))
    with pytest.raises(DataError, match=r"column 'user_id' is missing.*whole match model.*"
                                        r"reads both towers' columns.*predict with .*item"):
        predict(str(export), str(items_only), str(tmp_path / "out2.parquet"))
    with pytest.raises(ExportError, match=r"\['similarity'\].*user tower of a match model "
                                          r"alone.*user_tower_emb only"):
        predict(str(export / "user"), str(tmp_path / "eval.parquet"),
                str(tmp_path / "out3.parquet"), output_columns=("similarity",))
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


def test_mixed_up_tower_exports_are_refused(exported, tmp_path):
    tmp, export = exported
    mixed = tmp_path / "mixed"
    shutil.copytree(export / "user", mixed)
    shutil.copy(export / "item" / "tower.json", mixed / "tower.json")
    with pytest.raises(ExportError, match=r"says this is the item tower's export, but .* is "
                                          r"the user tower: the files of two exports are mixed"):
        predict(str(mixed), str(tmp / "eval.parquet"), str(tmp_path / "a.parquet"))
    os.remove(mixed / "tower.json")
    with pytest.raises(ExportError, match=r"is the user tower of a match model alone, but "
                                          r"tower.json is missing"):
        predict(str(mixed), str(tmp / "eval.parquet"), str(tmp_path / "b.parquet"))
    whole = tmp_path / "whole"
    shutil.copytree(export, whole, ignore=shutil.ignore_patterns("user", "item"))
    shutil.copy(export / "user" / "tower.json", whole / "tower.json")
    with pytest.raises(ExportError, match=r"is a whole model: the files of two exports"):
        predict(str(whole), str(tmp / "eval.parquet"), str(tmp_path / "c.parquet"))

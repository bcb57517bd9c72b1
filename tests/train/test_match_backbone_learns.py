"""The match backbone end to end: a planted user-item affinity learned through in-batch
negatives (recall@5 far above chance); with sampled negatives it trains, exports and
predicts, the whole model and each tower apart (from its own columns and tables alone)
embedding alike."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate

GROUPS = 8


def _rows(count: int, seed: int) -> pa.Table:
    """Users 0-47 each click items of their own group (user % 8 == item % 8) only; the
    user's age and the item's category are noise."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 48, count)
    items = rng.integers(0, 96 // GROUPS, count) * GROUPS + users % GROUPS
    return pa.table({"user_id": users, "age": rng.uniform(10, 60, count),
                     "adgroup_id": items, "cate_id": rng.integers(0, 5, count),
                     "clk": np.ones(count)})


# The user tower: its group through an MLP block, then a lambda block over that and the
# group side by side (16 + 9 = 25 wide, projected
# to output_dim 8); the item tower: its group through an MLP ending at 8 (no projection).
BACKBONE = """
  blocks { name: "user_in" inputs { feature_group_name: "user" } input_layer {} }
  blocks { name: "item_in" inputs { feature_group_name: "item" } input_layer {} }
  blocks { name: "user_mlp" inputs { block_name: "user_in" }
           module { class_name: "MLP" mlp { hidden_units: [16] } } }
  blocks { name: "user_emb" inputs { block_name: "user_mlp" } inputs { block_name: "user_in" }
           lambda { expression: "lambda x: x * 1.0" } }
  blocks { name: "item_emb" inputs { block_name: "item_in" }
           module { class_name: "MLP" mlp { hidden_units: [16, 8] } } }
  output_blocks: "item_emb" output_blocks: "user_emb"
"""


def _config(tmp_path, negatives: str, epochs: int, sampler: str = "") -> str:
    dynamic = 'dynamicemb { max_capacity: 1024 initializer_args { mode: "NORMAL" ' \
              'std_dev: 0.1 } }'
    return f"""
train_input_path: "{tmp_path}/train.parquet"
eval_input_path: "{tmp_path}/eval.parquet"
model_dir: "{tmp_path}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: {epochs}
}}
data_config {{ batch_size: 32 dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0 {sampler} }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 8 {dynamic} }} }}
feature_configs {{ raw_feature {{ feature_name: "age" expression: "user:age" }} }}
feature_configs {{ id_feature {{ feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 8 {dynamic} }} }}
feature_configs {{ id_feature {{ feature_name: "cate_id" expression: "item:cate_id"
  num_buckets: 5 embedding_dim: 4 }} }}
model_config {{
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id"
    feature_names: "age" }}
  feature_groups {{ group_name: "item" group_type: DEEP feature_names: "adgroup_id"
    feature_names: "cate_id" }}
  match_backbone {{ backbone {{ {BACKBONE} }}
    model_params {{ output_dim: 8 similarity: COSINE temperature: 0.1 {negatives} }} }}
  metrics {{ recall_at_k {{ top_k: 5 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def _write_data(tmp_path) -> None:
    pq.write_table(_rows(1536, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(320, 1), tmp_path / "eval.parquet")


def test_match_backbone_learns_a_planted_user_item_affinity(tmp_path):
    _write_data(tmp_path)
    config = parse_pipeline_config(_config(tmp_path, "in_batch_negative: true", 6))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 32 items a row: chance puts the positive in the top 5 for 5/32 (0.16) of the rows;
    # the row's group holds about 4 of them, all ranked first once the affinity is learned
    assert result["recall@5"] > 0.6, result


def test_match_backbone_with_sampled_negatives_exports_both_towers_and_each_apart(tmp_path):
    _write_data(tmp_path)
    items = np.arange(96)
    pq.write_table(pa.table({"id": items, "weight": np.ones(96),
                             "attrs": [f"{i}:{i % 5}" for i in items]}),
                   tmp_path / "items.parquet")
    sampler = (f'negative_sampler {{ input_path: "{tmp_path}/items.parquet" num_sample: 16 '
               f'attr_fields: "adgroup_id" attr_fields: "cate_id" '
               f'item_id_field: "adgroup_id" }}')
    config = parse_pipeline_config(_config(tmp_path, "", 1, sampler))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 48 and result["num_examples"] == 320
    assert 0 <= result["recall@5"] <= 1 and result["softmax_cross_entropy"] > 0
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "model")))
    eval_rows = pq.read_table(tmp_path / "eval.parquet")
    predict(str(export), str(tmp_path / "eval.parquet"), str(tmp_path / "whole.parquet"))
    whole = pq.read_table(tmp_path / "whole.parquet")
    assert whole.column_names == ["item_tower_emb", "similarity", "user_tower_emb"]
    user = torch.tensor(whole["user_tower_emb"].to_pylist())
    item = torch.tensor(whole["item_tower_emb"].to_pylist())
    assert user.shape == item.shape == (320, 8)
    torch.testing.assert_close(user.norm(dim=1), torch.ones(320))  # COSINE
    torch.testing.assert_close(torch.tensor(whole["similarity"].to_pylist()),
                               (user * item).sum(dim=1) / 0.1, rtol=1e-5, atol=1e-5)
    # each tower from its own columns alone, as the whole model embeds
    columns = {"user": ["user_id", "age"], "item": ["adgroup_id", "cate_id"]}
    for tower, expected in (("user", user), ("item", item)):
        alone = tmp_path / f"{tower}s.parquet"
        pq.write_table(eval_rows.select(columns[tower]), alone)
        predict(str(export / tower), str(alone), str(tmp_path / f"{tower}_emb.parquet"))
        out = pq.read_table(tmp_path / f"{tower}_emb.parquet")
        assert out.column_names == [f"{tower}_tower_emb"]
        torch.testing.assert_close(torch.tensor(out[f"{tower}_tower_emb"].to_pylist()),
                                   expected, rtol=0, atol=0)
        meta = json.loads((export / tower / "tower.json").read_text())
        assert meta["model"] == "match_backbone" and meta["feature_groups"] == [tower]
        assert meta["input_columns"] == columns[tower] and meta["dimension"] == 8
        model = torch.jit.load(str(export / tower / "scripted_model.pt"))
        tables = sorted(t.name for _, t in model.embedding.tables.named_children())
        assert tables == (["user_id"] if tower == "user" else ["adgroup_id", "cate_id"])


# TorchEasyRec's form of a match backbone over its DSSM example's groups (the user group's
# click sequence mean-pooled among its columns): input layers, then each tower's MLP, and
# model_params left empty (output_dim 64: both 128-wide MLPs projected).
EXAMPLE_BACKBONE = """
backbone {
  blocks { name: "user" inputs { feature_group_name: "user" } input_layer {} }
  blocks { name: "item" inputs { feature_group_name: "item" } input_layer {} }
  blocks { name: "user_tower" inputs { block_name: "user" }
           module { class_name: "MLP" mlp { hidden_units: [512, 256, 128]
                    activation: "nn.ReLU" use_bn: false dropout_ratio: [0.0, 0.0, 0.0] } } }
  blocks { name: "item_tower" inputs { block_name: "item" }
           module { class_name: "MLP" mlp { hidden_units: [512, 256, 128]
                    activation: "nn.ReLU" use_bn: false dropout_ratio: [0.0, 0.0, 0.0] } } }
  output_blocks: "user_tower"
  output_blocks: "item_tower"
}
model_params {
}
"""


def test_a_torcheasyrec_style_match_backbone_trains_and_exports_its_user_tower(tmp_path):
    from google.protobuf import text_format
    from match_examples import local_match_example

    config = local_match_example(tmp_path, "dssm_taobao")
    config.model_config.ClearField("dssm")
    text_format.Merge(EXAMPLE_BACKBONE, config.model_config.match_backbone)
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 2 and result["num_examples"] == 64
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "m")))
    meta = json.loads((export / "user" / "tower.json").read_text())
    assert meta["feature_groups"] == ["user"] and meta["dimension"] == 64
    assert "click_50_seq__adgroup_id" in meta["features"]
    assert not {"campaign_id", "customer", "price"} & set(meta["tables"])  # item-only
    predict(str(export), str(tmp_path / "data" / "eval"), str(tmp_path / "whole.parquet"))
    predict(str(export / "user"), str(tmp_path / "data" / "eval"),
            str(tmp_path / "user.parquet"))
    whole = torch.tensor(pq.read_table(tmp_path / "whole.parquet")["user_tower_emb"]
                         .to_pylist())
    alone = torch.tensor(pq.read_table(tmp_path / "user.parquet")["user_tower_emb"]
                         .to_pylist())
    assert alone.shape == (64, 64)
    torch.testing.assert_close(alone, whole, rtol=0, atol=0)

"""DAT end to end: a planted user-item affinity learned through in-batch negatives
(recall@5 far above chance) with the AMM losses beside the softmax loss; the sampler's
negatives through train_eval, export and predict, each tower exported apart with its
augment group and embedding as the whole model does; TorchEasyRec's DAT test config
trains, exports and predicts on local mock rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from match_examples import local_dat_mock, mock_items
from test_dssm_learns import _write_data

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate


def _config(tmp_path, negatives: str, epochs: int, sampler: str = "") -> str:
    """DSSM's planted-affinity config with each tower's id as its augment vector too (as
    TorchEasyRec's example shares it). The AMM losses sum over the batch's 32 rows, so
    their weights are 0.05 here (a mean's 1.6): at TorchEasyRec's default 0.5 they pull
    the shared id embeddings harder than the softmax loss does, and recall@5 fell to
    about 0.6 in a run of this test."""
    table = 'dynamicemb { max_capacity: 1024 initializer_args { mode: "NORMAL" ' \
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
  embedding_dim: 8 {table} }} }}
feature_configs {{ id_feature {{ feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 8 {table} }} }}
model_config {{
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id" }}
  feature_groups {{ group_name: "user_augment" group_type: DEEP feature_names: "user_id" }}
  feature_groups {{ group_name: "item" group_type: DEEP feature_names: "adgroup_id" }}
  feature_groups {{ group_name: "item_augment" group_type: DEEP feature_names: "adgroup_id" }}
  dat {{ user_tower {{ input: "user" augment_input: "user_augment"
                      mlp {{ hidden_units: [16] }} }}
         item_tower {{ input: "item" augment_input: "item_augment"
                      mlp {{ hidden_units: [16] }} }}
         output_dim: 8 similarity: COSINE temperature: 0.1 amm_u_weight: 0.05
         amm_i_weight: 0.05 {negatives} }}
  metrics {{ recall_at_k {{ top_k: 5 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def test_dat_learns_a_planted_user_item_affinity_from_in_batch_negatives(tmp_path):
    _write_data(tmp_path)
    config = parse_pipeline_config(_config(tmp_path, "in_batch_negative: true", 6))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 32 items a row: chance puts the positive in the top 5 for 5/32 (0.16) of the rows;
    # the row's group holds about 4 of them, all ranked first once the affinity is learned
    assert result["recall@5"] > 0.6, result
    # evaluation reports the softmax loss alone (the AMM losses train only)
    assert result["softmax_cross_entropy"] > 0
    assert not any(key.startswith("amm_loss") for key in result)


def test_dat_with_sampled_negatives_exports_its_towers_with_their_augment_groups(tmp_path):
    _write_data(tmp_path)
    items = np.arange(96)
    pq.write_table(pa.table({"id": items, "weight": np.ones(96),
                             "attrs": [str(i) for i in items]}), tmp_path / "items.parquet")
    sampler = (f'negative_sampler {{ input_path: "{tmp_path}/items.parquet" num_sample: 16 '
               f'attr_fields: "adgroup_id" item_id_field: "adgroup_id" }}')
    config = parse_pipeline_config(_config(tmp_path, "", 2, sampler))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 96 and result["num_examples"] == 320
    assert 0 <= result["recall@5"] <= 1 and result["softmax_cross_entropy"] > 0
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "model")))
    predict(str(export), str(tmp_path / "eval.parquet"), str(tmp_path / "pred.parquet"))
    out = pq.read_table(tmp_path / "pred.parquet")
    assert out.column_names == ["item_tower_emb", "similarity", "user_tower_emb"]
    user = torch.tensor(out["user_tower_emb"].to_pylist())
    item = torch.tensor(out["item_tower_emb"].to_pylist())
    assert user.shape == item.shape == (320, 8)
    torch.testing.assert_close(user.norm(dim=1), torch.ones(320))  # COSINE
    torch.testing.assert_close(torch.tensor(out["similarity"].to_pylist()),
                               (user * item).sum(dim=1) / 0.1, rtol=1e-5, atol=1e-5)
    eval_rows = pq.read_table(tmp_path / "eval.parquet")
    for tower, column in (("user", "user_id"), ("item", "adgroup_id")):
        meta = json.loads((export / tower / "tower.json").read_text())
        assert meta["feature_groups"] == [tower, f"{tower}_augment"]
        assert meta["tables"] == [column] and meta["input_columns"] == [column]
        path = tmp_path / f"{tower}s.parquet"
        pq.write_table(eval_rows.select([column]), path)
        predict(str(export / tower), str(path), str(tmp_path / f"{tower}_emb.parquet"))
        alone = pq.read_table(tmp_path / f"{tower}_emb.parquet")[f"{tower}_tower_emb"]
        torch.testing.assert_close(torch.tensor(alone.to_pylist()),
                                   user if tower == "user" else item, rtol=0, atol=0)


def test_torcheasyrecs_dat_test_config_trains_and_its_towers_export_and_predict(tmp_path):
    """TorchEasyRec's DAT test config (its mock features read from their own columns, a
    shared ``embedding_name``, bucketized and raw values, a list of 4) on generated rows:
    each tower alone embeds from its own columns as the whole model does, the item tower
    every item of the sampler's table."""
    config = local_dat_mock(tmp_path)
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 2 and result["num_examples"] == 64
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1
    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "m")))
    predict(str(export), str(tmp_path / "eval.parquet"), str(tmp_path / "whole.parquet"))
    whole = pq.read_table(tmp_path / "whole.parquet")
    eval_rows = pq.read_table(tmp_path / "eval.parquet")
    items = mock_items()
    for tower, rows in (("user", eval_rows), ("item", items)):
        meta = json.loads((export / tower / "tower.json").read_text())
        assert meta["feature_groups"] == [tower, f"{tower}_augment"]
        assert meta["dimension"] == 16
        columns = meta["input_columns"]
        assert columns == [c for c in eval_rows.column_names if c.startswith(tower)]
        pq.write_table(rows.select(columns), tmp_path / f"{tower}s.parquet")
        predict(str(export / tower), str(tmp_path / f"{tower}s.parquet"),
                str(tmp_path / f"{tower}_emb.parquet"))
        alone = torch.tensor(pq.read_table(tmp_path / f"{tower}_emb.parquet")
                             [f"{tower}_tower_emb"].to_pylist())
        assert alone.shape == (rows.num_rows, 16)
        torch.testing.assert_close(alone.norm(dim=1), torch.ones(rows.num_rows))  # COSINE
        if tower == "user":
            torch.testing.assert_close(alone, torch.tensor(whole["user_tower_emb"]
                                                           .to_pylist()), rtol=0, atol=0)
    # the whole model's item rows are items of the table: the item tower embeds them alike
    item = torch.tensor(pq.read_table(tmp_path / "item_emb.parquet")["item_tower_emb"]
                        .to_pylist())
    row_of = {item_id: row for row, item_id in enumerate(items["item_id"].to_pylist())}
    picked = [row_of[i] for i in eval_rows["item_id"].to_pylist()]
    torch.testing.assert_close(item[picked], torch.tensor(whole["item_tower_emb"]
                                                          .to_pylist()), rtol=0, atol=0)

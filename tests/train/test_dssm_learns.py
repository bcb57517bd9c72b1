"""DSSM end to end: a planted user-item affinity learned through in-batch negatives
(recall@5 far above chance), the sampler's negatives through train_eval, export and
predict (the exported towers' similarity equal to their embeddings' dot product)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from match_examples import local_match_example

import hashrec.data.sampler as sampler_module
from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate

GROUPS = 8


def _rows(count: int, seed: int) -> pa.Table:
    """Users 0-47 each click items of their own group (user % 8 == item % 8) only."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 48, count)
    items = rng.integers(0, 96 // GROUPS, count) * GROUPS + users % GROUPS
    return pa.table({"user_id": users, "adgroup_id": items, "clk": np.ones(count)})


def _config(tmp_path, negatives: str, epochs: int, sampler: str = "") -> str:
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
  embedding_dim: 8 dynamicemb {{ max_capacity: 1024
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ id_feature {{ feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 8 dynamicemb {{ max_capacity: 1024
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
model_config {{
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id" }}
  feature_groups {{ group_name: "item" group_type: DEEP feature_names: "adgroup_id" }}
  dssm {{ user_tower {{ input: "user" mlp {{ hidden_units: [16] }} }}
          item_tower {{ input: "item" mlp {{ hidden_units: [16] }} }}
          output_dim: 8 similarity: COSINE temperature: 0.1 {negatives} }}
  metrics {{ recall_at_k {{ top_k: 5 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def _write_data(tmp_path) -> None:
    pq.write_table(_rows(1536, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(320, 1), tmp_path / "eval.parquet")


def test_dssm_learns_a_planted_user_item_affinity_from_in_batch_negatives(tmp_path):
    _write_data(tmp_path)
    config = parse_pipeline_config(_config(tmp_path, "in_batch_negative: true", 6))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 32 items a row: chance puts the positive in the top 5 for 5/32 (0.16) of the rows;
    # the row's group holds about 4 of them, all ranked first once the affinity is learned
    assert result["recall@5"] > 0.6, result


def test_dssm_with_sampled_negatives_trains_exports_and_predicts_embeddings(tmp_path):
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
    export_model(config, str(tmp_path / "export"), latest_checkpoint(str(tmp_path / "model")))
    predict(str(tmp_path / "export"), str(tmp_path / "eval.parquet"),
            str(tmp_path / "pred.parquet"))
    out = pq.read_table(tmp_path / "pred.parquet")
    assert out.column_names == ["item_tower_emb", "similarity", "user_tower_emb"]
    user = torch.tensor(out["user_tower_emb"].to_pylist())
    item = torch.tensor(out["item_tower_emb"].to_pylist())
    assert user.shape == item.shape == (320, 8)
    torch.testing.assert_close(user.norm(dim=1), torch.ones(320))  # COSINE
    expected = (user * item).sum(dim=1) / 0.1
    torch.testing.assert_close(torch.tensor(out["similarity"].to_pylist()), expected,
                               rtol=1e-5, atol=1e-5)


def test_a_run_reads_the_item_table_once(tmp_path, monkeypatch):
    """The eval input's check at startup, the training loader and each evaluation's draw
    from one read of the item table."""
    _write_data(tmp_path)
    path = str(tmp_path / "items.parquet")
    pq.write_table(pa.table({"id": np.arange(96), "weight": np.ones(96),
                             "attrs": [str(i) for i in range(96)]}), path)
    reads = []
    read_table = sampler_module.read_table
    monkeypatch.setattr(sampler_module, "read_table",
                        lambda file, *rest: reads.append(file) or read_table(file, *rest))
    sampler = (f'negative_sampler {{ input_path: "{path}" num_sample: 8 '
               f'attr_fields: "adgroup_id" item_id_field: "adgroup_id" }}')
    config = parse_pipeline_config(_config(tmp_path, "", 1, sampler))
    config.train_config.save_checkpoints_steps = 24  # two evaluations
    assert train_and_evaluate(config)["step"] == 48
    assert reads == [path]


@pytest.mark.parametrize("sampled", [False, True], ids=["in-batch", "sampled"])
def test_the_same_seed_trains_the_same_model(tmp_path, sampled):
    _write_data(tmp_path)
    pq.write_table(pa.table({"id": np.arange(96), "weight": np.ones(96),
                             "attrs": [str(i) for i in range(96)]}), tmp_path / "items.parquet")
    sampler = (f'negative_sampler {{ input_path: "{tmp_path}/items.parquet" num_sample: 8 '
               f'attr_fields: "adgroup_id" item_id_field: "adgroup_id" }}') if sampled else ""
    losses = []
    for run in range(2):
        text = _config(tmp_path, "" if sampled else "in_batch_negative: true", 1, sampler)
        config = parse_pipeline_config(text.replace("/model", f"/model{run}"))
        losses.append(train_and_evaluate(config)["loss"])
    assert losses[0] == losses[1]


def test_torcheasyrecs_dssm_taobao_example_loads_and_trains_on_local_files(tmp_path):
    config = local_match_example(tmp_path, "dssm_taobao")
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 2 and result["num_examples"] == 64
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1

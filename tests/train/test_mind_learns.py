"""MIND end to end: trained through in-batch negatives on rows whose click sequence
holds two item groups and whose clicked item is of either, its label-aware recall
(TorchEasyRec's evaluation, which pools each row's interests by the row's own item)
above chance, exported and predicted, the user tower giving each user's interests
(B, max_k, D); TorchEasyRec's mind_taobao example loads and trains on local files.

The label-aware recall is not evidence that the planted affinity was learned: the
pooling sees the clicked item, so a MIND trained and evaluated on rows whose item is
drawn apart from the sequence scores about as high (see the first test's comment)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from match_examples import local_match_example

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate

GROUPS = 8
ITEMS = 96


def _rows(count: int, seed: int) -> pa.Table:
    """Each row's user clicked items of two groups (item % 8) and clicks one more item of
    either; every row has user id 0: the sequence alone tells."""
    rng = np.random.default_rng(seed)
    sequences, items = [], []
    for _ in range(count):
        groups = rng.choice(GROUPS, 2, replace=False)
        length = int(rng.integers(4, 9))
        clicked = rng.integers(0, ITEMS // GROUPS, length) * GROUPS + groups[np.arange(length) % 2]
        sequences.append("|".join(map(str, clicked)))
        items.append(int(rng.integers(0, ITEMS // GROUPS)) * GROUPS + int(rng.choice(groups)))
    return pa.table({"user_id": np.zeros(count, dtype=np.int64), "adgroup_id": items,
                     "click_seq__adgroup_id": sequences, "clk": np.ones(count)})


CONFIG = """
train_input_path: "{tmp}/train.parquet"
eval_input_path: "{tmp}/eval.parquet"
model_dir: "{tmp}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 5
}}
data_config {{ batch_size: 32 dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 dynamicemb {{ max_capacity: 2048
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ id_feature {{ feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 8 dynamicemb {{ max_capacity: 1024
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ sequence_id_feature {{ feature_name: "click_seq__adgroup_id"
  expression: "user:click_seq__adgroup_id" sequence_length: 8 sequence_delim: "|"
  embedding_dim: 8 num_buckets: {items} }} }}
model_config {{
  feature_groups {{ group_name: "user" group_type: DEEP feature_names: "user_id" }}
  feature_groups {{ group_name: "hist" group_type: SEQUENCE
                    feature_names: "click_seq__adgroup_id" }}
  feature_groups {{ group_name: "item" group_type: DEEP feature_names: "adgroup_id" }}
  mind {{ user_tower {{ input: "user" history_input: "hist"
                        user_mlp {{ hidden_units: [8] }}
                        hist_seq_mlp {{ hidden_units: [16, 8] }}
                        capsule_config {{ max_k: 3 max_seq_len: 8 high_dim: 8 }}
                        concat_mlp {{ hidden_units: [16] }} }}
          item_tower {{ input: "item" mlp {{ hidden_units: [16] }} }}
          output_dim: 8 simi_pow: 20 similarity: COSINE temperature: 0.1
          in_batch_negative: true }}
  metrics {{ recall_at_k {{ top_k: 5 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


def test_mind_trains_on_click_sequences_exports_and_predicts_interests(tmp_path):
    pq.write_table(_rows(1536, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(320, 1), tmp_path / "eval.parquet")
    config = parse_pipeline_config(CONFIG.format(tmp=tmp_path, items=ITEMS))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 32 items a row: chance puts the positive in the top 5 for 5/32 (0.16) of the rows.
    # The recall pools each row's interests by label-aware attention with its own item,
    # so it sees the label: here 0.52, where the same model trained and evaluated on rows
    # whose item is drawn apart from the sequence reaches 0.53 (seeds 0-2: 0.33 to 0.53
    # with the affinity, 0.32 to 0.53 without). Scoring the items, as at serving, by the
    # best of each user's exported interests gives 0.21 (without the affinity 0.19).
    # A scorer that knows each row's two groups reaches about 0.61, one that knows the
    # clicked item's group about 0.89; this model reaches neither, and the assertion
    # checks only that the metric is the label-aware one and above chance.
    assert result["recall@5"] > 0.35, result

    export = tmp_path / "export"
    export_model(config, str(export), latest_checkpoint(str(tmp_path / "model")))
    predict(str(export), str(tmp_path / "eval.parquet"), str(tmp_path / "whole.parquet"))
    whole = pq.read_table(tmp_path / "whole.parquet")
    assert whole.column_names == ["item_tower_emb", "similarity", "user_tower_emb"]
    interests = torch.tensor(whole["user_tower_emb"].to_pylist())
    item = torch.tensor(whole["item_tower_emb"].to_pylist())
    assert interests.shape == (320, 3, 8) and item.shape == (320, 8)
    lengths = torch.tensor([len(s.split("|")) for s in
                            pq.read_table(tmp_path / "eval.parquet")
                            ["click_seq__adgroup_id"].to_pylist()])
    count = torch.log2(lengths.float()).clamp(1, 3).ceil()
    # COSINE: unit interests, as many as log2 of the length (rounded up), the rest zero
    torch.testing.assert_close(interests.norm(dim=-1),
                               (torch.arange(3) < count.unsqueeze(1)).float())
    # the whole model's similarity: the interests pooled by label-aware attention
    scores = (20 * torch.einsum("bkd,bd->bk", interests, item)).masked_fill(
        interests.norm(dim=-1) == 0, -1e9)
    user = torch.einsum("bk,bkd->bd", scores.softmax(-1), interests)
    user = torch.nn.functional.normalize(user, dim=-1)
    torch.testing.assert_close(torch.tensor(whole["similarity"].to_pylist()),
                               (user * item).sum(-1) / 0.1, rtol=1e-4, atol=1e-4)

    users = pq.read_table(tmp_path / "eval.parquet",
                          columns=["user_id", "click_seq__adgroup_id"])
    pq.write_table(users, tmp_path / "users.parquet")  # no item column
    predict(str(export / "user"), str(tmp_path / "users.parquet"),
            str(tmp_path / "user.parquet"))
    alone = pq.read_table(tmp_path / "user.parquet")
    assert alone.column_names == ["user_tower_emb"]
    torch.testing.assert_close(torch.tensor(alone["user_tower_emb"].to_pylist()), interests)
    meta = (export / "user" / "tower.json").read_text()
    assert '"interests": 3' in meta and '"hist"' in meta


def test_torcheasyrecs_mind_taobao_example_loads_and_trains_on_local_files(tmp_path):
    config = local_match_example(tmp_path, "mind_taobao",
                                 {"data_config.negative_sampler.num_eval_sample": 32})
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 2 and result["num_examples"] == 64
    assert 0 <= result["recall@1"] <= result["recall@5"] <= 1

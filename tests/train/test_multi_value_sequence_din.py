"""A DIN model over a sequence whose items hold several ids (value_dim 0) trains, alone and
on two CPU ranks (gloo), where the dynamic table's rows are sharded."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from two_ranks import eval_results, torchrun_train_eval

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import ConfigError, parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.features import build_feature_set
from hashrec.predict import predict
from hashrec.train import train_and_evaluate
from hashrec.train.session import build_session

TAGS = 8

CONFIG = """
train_input_path: "{tmp}/train.parquet"
eval_input_path: "{tmp}/eval.parquet"
model_dir: "{tmp}/{pooling}{value_dim}"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 5
}}
data_config {{ batch_size: 64 dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0 }}
feature_configs {{ id_feature {{ feature_name: "tag" expression: "item:tag"
  embedding_dim: 8 dynamicemb {{ max_capacity: 1024
  initializer_args {{ mode: "NORMAL" std_dev: 0.1 }} }} }} }}
feature_configs {{ sequence_feature {{ sequence_name: "click" sequence_length: 6
  sequence_delim: ";" features {{ id_feature {{ feature_name: "tag" expression: "item:tag"
  embedding_dim: 8 value_dim: {value_dim} pooling: "{pooling}" }} }} }} }}
model_config {{
  feature_groups {{ group_name: "deep" group_type: DEEP feature_names: "tag" }}
  feature_groups {{ group_name: "seq" group_type: SEQUENCE
                    feature_names: ["tag", "click__tag"] }}
  multi_tower_din {{
    towers {{ input: "deep" mlp {{ hidden_units: [8] }} }}
    din_towers {{ input: "seq" attn_mlp {{ hidden_units: [16] }} }}
    final {{ hidden_units: [8] }}
  }}
  losses {{ binary_cross_entropy {{}} }}
  metrics {{ auc {{}} }}
}}
"""


def _rows(count: int, seed: int) -> pa.Table:
    """Each clicked item holds a noise tag (TAGS and up) and then its tag (below TAGS),
    joined by "\x1d"; a row is clicked when its item's tag is one of the clicked items'
    tags: only an item's second value tells, which value_dim 1 would not read."""
    rng = np.random.default_rng(seed)
    sequences, tags, clicks = [], [], []
    for _ in range(count):
        seen = rng.choice(TAGS, int(rng.integers(1, 4)), replace=False)
        noise = rng.integers(TAGS, 4 * TAGS, len(seen))
        tag = int(rng.choice(seen)) if rng.random() < 0.5 else int(rng.integers(TAGS))
        sequences.append(";".join(f"{n}\x1d{t}" for n, t in zip(noise, seen)))
        tags.append(tag)
        clicks.append(float(tag in seen))
    return pa.table({"tag": tags, "click__tag": sequences, "clk": clicks})


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_din_over_items_of_several_tags_learns_them(tmp_path, pooling):
    pq.write_table(_rows(2048, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(512, 1), tmp_path / "eval.parquet")
    auc = {}
    for value_dim in (0, 1):
        config = parse_pipeline_config(CONFIG.format(tmp=tmp_path, pooling=pooling,
                                                     value_dim=value_dim))
        validate_pipeline_config(config)
        auc[value_dim] = train_and_evaluate(config)["auc"]
    # value_dim 0 pools both tags of an item and learns the rule (this run: 1.0); value_dim
    # 1 reads the noise tag alone and stays near chance (this run: 0.52)
    assert auc[0] > 0.9 and auc[1] < 0.7, auc


@pytest.mark.slow
def test_two_ranks_learn_items_of_several_tags(tmp_path):
    # The tag table is dynamic, so its rows are sharded over the ranks: every item's ids
    # travel to their owners and back before they are pooled per item.
    pq.write_table(_rows(2048, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(512, 1), tmp_path / "eval.parquet")
    path = tmp_path / "pipeline.config"
    path.write_text(CONFIG.format(tmp=tmp_path, pooling="sum", value_dim=0), encoding="utf-8")
    torchrun_train_eval(path, "--edit_config_json", json.dumps({"data_config.batch_size": 32}))
    result = eval_results(tmp_path / "sum0")[-1]
    assert result["auc"] > 0.9, result  # this run: 0.999


def test_the_exported_model_pools_items_as_training_did(tmp_path):
    pq.write_table(_rows(256, 0), tmp_path / "train.parquet")
    pq.write_table(_rows(100, 1), tmp_path / "eval.parquet")
    config = parse_pipeline_config(CONFIG.format(tmp=tmp_path, pooling="mean", value_dim=0)
                                   .replace("num_epochs: 5", "num_epochs: 1"))
    train_and_evaluate(config)
    checkpoint = latest_checkpoint(str(tmp_path / "mean0"))
    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(checkpoint, session.model, None,
                       session.model.embedding.dynamic_tables())
    session.model.eval()
    table = pq.read_table(tmp_path / "eval.parquet")
    with torch.no_grad():
        want = session.model(session.feature_set.parse(table))["probs"]
    export_model(config, str(tmp_path / "export"), checkpoint)
    predict(str(tmp_path / "export"), str(tmp_path / "eval.parquet"),
            str(tmp_path / "out.parquet"))
    got = torch.tensor(pq.read_table(tmp_path / "out.parquet")["probs"].to_pylist())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_config_takes_value_dim_0_and_1_and_names_other_value_dims(tmp_path):
    for value_dim in (0, 1):
        config = parse_pipeline_config(CONFIG.format(tmp=tmp_path, pooling="sum",
                                                     value_dim=value_dim))
        validate_pipeline_config(config)
        build_feature_set(config)
    config = parse_pipeline_config(CONFIG.format(tmp=tmp_path, pooling="sum", value_dim=2))
    with pytest.raises(ConfigError, match=r"feature 'click__tag': value_dim 2 is not "
                                          r"supported on sequence features; set 0"):
        build_feature_set(config)

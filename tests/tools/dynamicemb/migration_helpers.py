"""Small pipeline configs and data for the migration tool tests."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.config import load_pipeline_config
from hashrec.train.session import build_session

DIM = 4
NUM_USERS = 60
NUM_ITEMS = 40


def dynamicemb_block(init_table: str = "", score_strategy: str = "LFU") -> str:
    init = f'init_table: "{init_table}"' if init_table else ""
    return (f'dynamicemb {{ max_capacity: 1000 score_strategy: "{score_strategy}" '
            f'initializer_args {{ mode: "NORMAL" std_dev: 0.05 }} {init} }}')


def zch_block(size: int = 32, interval: int = 2, policy: str = "lfu {}") -> str:
    return f"zch {{ zch_size: {size} eviction_interval: {interval} {policy} }}"


def write_config(path: str, user_ids: str, item_ids: str, model_dir: str = "",
                 train_path: str = "", sparse_optimizer: str = "adagrad_optimizer",
                 cate: str = "num_buckets: 5") -> str:
    """A MultiTowerDIN config on columns user_id, item_id, cate, clk.

    ``user_ids`` / ``item_ids`` / ``cate`` are the table settings of the three id features.
    """
    text = f"""
model_dir: "{model_dir}"
train_input_path: "{train_path}"
train_config {{
  sparse_optimizer {{ {sparse_optimizer} {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_epochs: 1
  log_step_count_steps: 1000
}}
data_config {{
  batch_size: 64
  dataset_type: ParquetDataset
  label_fields: "clk"
  num_workers: 0
}}
feature_configs {{ id_feature {{ feature_name: "user_id" expression: "user:user_id"
  embedding_dim: {DIM} {user_ids} }} }}
feature_configs {{ id_feature {{ feature_name: "item_id" expression: "item:item_id"
  embedding_dim: {DIM} {item_ids} }} }}
feature_configs {{ id_feature {{ feature_name: "cate" expression: "item:cate"
  embedding_dim: {DIM} {cate} }} }}
model_config {{
  feature_groups {{ group_name: "deep" feature_names: ["user_id", "item_id", "cate"]
    group_type: DEEP }}
  multi_tower_din {{
    towers {{ input: "deep" mlp {{ hidden_units: [8] }} }}
    final {{ hidden_units: [4] }}
  }}
}}
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def write_data(path: str, rows: int = 512, seed: int = 0) -> str:
    """Parquet rows whose label depends on user and item (frequent ids first)."""
    rng = np.random.default_rng(seed)
    users = np.minimum(rng.geometric(0.08, rows), NUM_USERS) + 1000
    items = np.minimum(rng.geometric(0.1, rows), NUM_ITEMS) + 5000
    clk = ((users + items) % 3 == 0).astype(np.int64)
    table = pa.table({"user_id": users.astype(np.int64), "item_id": items.astype(np.int64),
                      "cate": (items % 5).astype(np.int64), "clk": clk})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return path


def session_of(config_path: str):
    return build_session(load_pipeline_config(config_path), device=torch.device("cpu"))


def batch_of(session, users, items, cates=None):
    """A Batch of explicit rows."""
    users = np.asarray(users, dtype=np.int64)
    cates = np.zeros_like(users) if cates is None else np.asarray(cates, dtype=np.int64)
    table = pa.table({"user_id": users, "item_id": np.asarray(items, dtype=np.int64),
                      "cate": cates, "clk": np.zeros_like(users)})
    return session.feature_set.parse(table)

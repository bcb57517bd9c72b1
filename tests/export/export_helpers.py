"""Small pipeline configs, generated data and models for the export and predict tests."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from model_kinds import CLICK_SEQUENCE

from hashrec.config import load_pipeline_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_DYNAMIC = """
    dynamicemb {
      max_capacity: 20000
      initializer_args { mode: "NORMAL"; std_dev: 0.05 }
      score_strategy: "LFU"
      init_capacity_per_rank: 1024
      frequency_admission_strategy { threshold: 2 }
    }"""


def _id_feature(name: str, side: str, dynamic: bool, buckets: int) -> str:
    table = _DYNAMIC if dynamic else f"\n    hash_bucket_size: {buckets}"
    return (f'feature_configs {{\n  id_feature {{\n    feature_name: "{name}"\n'
            f'    expression: "{side}:{name}"\n    embedding_dim: 8{table}\n  }}\n}}\n')


def config_text(dynamic: bool = True) -> str:
    """MultiTowerDIN on Taobao-like columns: dynamic (fused) user/item id tables unless
    ``dynamic`` is False, num_buckets and hashed small tables, a raw dense price, a
    10-long click sequence sharing the item tables."""
    text = """
train_config {
  sparse_optimizer { adagrad_optimizer { lr: 0.05 } constant_learning_rate {} }
  dense_optimizer { adam_optimizer { lr: 0.003 } constant_learning_rate {} }
  num_epochs: 1
  log_step_count_steps: 100
}
data_config {
  batch_size: 256
  dataset_type: ParquetDataset
  label_fields: "clk"
  num_workers: 0
}
"""
    for name, side, buckets in (("user_id", "user", 5000), ("adgroup_id", "item", 5000),
                                ("cate_id", "item", 500)):
        text += _id_feature(name, side, dynamic, buckets)
    text += """
feature_configs { id_feature { feature_name: "cms_segid" expression: "user:cms_segid"
  num_buckets: 98 embedding_dim: 8 } }
feature_configs { id_feature { feature_name: "pid" expression: "context:pid"
  hash_bucket_size: 20 embedding_dim: 8 } }
feature_configs { raw_feature { feature_name: "price" expression: "item:price" } }
""" + CLICK_SEQUENCE + """
model_config {
  feature_groups { group_name: "deep" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid", "price", "adgroup_id", "cate_id"] }
  feature_groups { group_name: "seq" group_type: SEQUENCE
    feature_names: ["adgroup_id", "cate_id", "click_50_seq__adgroup_id",
                    "click_50_seq__cate_id"] }
  multi_tower_din {
    towers { input: "deep" mlp { hidden_units: [16, 8] } }
    din_towers { input: "seq" attn_mlp { hidden_units: [8] } }
    final { hidden_units: [8] }
  }
  metrics { auc {} }
  losses { binary_cross_entropy {} }
}
"""
    return text


def write_config(directory, data_dir, model_dir, dynamic: bool = True,
                 data_types: dict[str, str] | None = None) -> str:
    """``config_text(dynamic)`` with its paths; ``data_types``: feature name -> data_type
    (set on every feature of that name: sequence sub-features share the table)."""
    path = os.path.join(str(directory), "dynamic.config" if dynamic else "dense.config")
    paths = (f'train_input_path: "{data_dir}/train"\neval_input_path: "{data_dir}/eval"\n'
             f'model_dir: "{model_dir}"\n')
    text = config_text(dynamic)
    for name, data_type in (data_types or {}).items():
        text = text.replace(f'feature_name: "{name}"',
                            f'feature_name: "{name}" data_type: "{data_type}"')
    with open(path, "w", encoding="utf-8") as f:
        f.write(paths + text)
    return path


def run(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


def eval_predictions(config_path: str, checkpoint: str, input_path: str) -> torch.Tensor:
    """The trained model's eval-mode predictions (``probs``, RocketLaunching's
    ``probs_light``) on ``input_path``, in file order."""
    from hashrec.checkpoint import restore_checkpoint
    from hashrec.train.session import build_session

    session = build_session(load_pipeline_config(config_path), device=torch.device("cpu"))
    restore_checkpoint(checkpoint, session.model, None,
                       session.model.embedding.dynamic_tables(), restore_optimizer=False)
    session.model.eval()
    probs = []
    with torch.no_grad():
        for batch in session.loader(input_path, "eval"):
            probs.append(session.model(batch)[session.model.prediction])
    return torch.cat(probs)

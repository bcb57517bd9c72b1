"""A small MultiTowerDIN config and its variants for fine-tune restore tests.

The base model reads user_id and item_id (dynamic, fused into the DEEP group's
storage), cate (num_buckets) and shop (ZCH). ``trained_model`` gives its tables and
layers values no fresh model has (optimizer columns included), so a restored part
is told from a fresh one bit for bit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hashrec.config import load_pipeline_config
from hashrec.train.session import build_session

DIM = 4
DYNAMIC = 'dynamicemb { max_capacity: 1000 initializer_args { mode: "NORMAL" std_dev: 0.05 } }'


def _feature(name: str, feature_name: str, bucketize: str, dim: int) -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{feature_name}" expression: '
            f'"item:{name}" embedding_dim: {dim} {bucketize} }} }}\n')


FEATURES = {
    "user_id": DYNAMIC, "item_id": DYNAMIC, "cate": "num_buckets: 5",
    "shop": "zch { zch_size: 16 eviction_interval: 2 lfu {} }",
    "brand": DYNAMIC, "age": "num_buckets: 7",
}


def write_config(path, features=("user_id", "item_id", "cate", "shop"),
                 hidden_units=(8,), group: str = "deep", renamed: dict | None = None,
                 extra: str = "", model_dir: str = "m", train_path: str = "",
                 changed: dict | None = None, dims: dict | None = None) -> str:
    """A config reading ``features`` (in this order) in one DEEP group named ``group``
    with a tower of ``hidden_units``; ``renamed``: {feature: new feature_name} (the
    column stays); ``changed``: {feature: bucketization replacing FEATURES'}; ``dims``:
    {feature: embedding_dim other than DIM}; ``extra``: more train_config fields."""
    renamed, changed, dims = renamed or {}, changed or {}, dims or {}
    text = f"""
model_dir: "{model_dir}"
train_input_path: "{train_path}"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_steps: 2
  log_step_count_steps: 1000
  {extra}
}}
data_config {{ batch_size: 32 dataset_type: ParquetDataset label_fields: "clk"
  num_workers: 0 }}
"""
    for name in features:
        text += _feature(name, renamed.get(name, name), changed.get(name, FEATURES[name]),
                         dims.get(name, DIM))
    names = ", ".join(f'"{renamed.get(n, n)}"' for n in features)
    units = ", ".join(str(u) for u in hidden_units)
    text += f"""
model_config {{
  feature_groups {{ group_name: "{group}" feature_names: [{names}] group_type: DEEP }}
  multi_tower_din {{
    towers {{ input: "{group}" mlp {{ hidden_units: [{units}] }} }}
    final {{ hidden_units: [4] }}
  }}
}}
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def write_data(path, rows: int = 96, seed: int = 0) -> str:
    """Parquet rows holding every column of FEATURES and a label."""
    rng = np.random.default_rng(seed)
    columns = {"user_id": rng.integers(1000, 1040, rows), "item_id": rng.integers(0, 30, rows),
               "cate": rng.integers(0, 5, rows), "shop": rng.integers(0, 50, rows),
               "brand": rng.integers(0, 20, rows), "age": rng.integers(0, 7, rows)}
    table = pa.table({**{k: v.astype(np.int64) for k, v in columns.items()},
                      "clk": rng.integers(0, 2, rows).astype(np.int64)})
    pq.write_table(table, str(path))
    return str(path)


def session_of(config_path: str, ctx=None):
    return build_session(load_pipeline_config(config_path), device=torch.device("cpu"),
                         ctx=ctx)


def trained_model(config_path: str, ctx=None):
    """A model of the config whose every part holds values a fresh one does not: random
    layers, dense and ZCH rows with optimizer columns 0.7, a used ZCH remapper and 20
    rows in each dynamic table (keys 0..19, on the ranks that own them)."""
    model = session_of(config_path, ctx).model
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(".rows"):
                tensor.copy_(torch.randn(tensor.shape, generator=gen))
                tensor[:, DIM:] = 0.7
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=gen))
        remapper = model.embedding.zch_remappers["shop"]
        remapper.slot_keys.copy_(torch.arange(100, 116))
        remapper.slot_used.fill_(True)
        remapper.step.fill_(9)
    tables = model.embedding.dynamic_tables()
    for storage, tag in model.embedding.table_locations().values():
        if storage in tables:
            put_rows(tables[storage], tag, seed=tag)
    return model


def put_rows(table, tag: int, seed: int, n: int = 20) -> None:
    """Rows for keys 0..n-1 under ``tag`` (the keys this rank owns, on a shard)."""
    keys = torch.arange(n, dtype=torch.int64)
    rows = torch.randn(n, table.row_dim, generator=torch.Generator().manual_seed(seed))
    owned = table_owned(table, keys)
    table.load_state(keys[owned], torch.full((int(owned.sum()),), tag, dtype=torch.int32),
                     rows[owned], torch.ones(int(owned.sum()), dtype=torch.int64))


def table_owned(table, keys: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    from hashrec.table.hashing import owner_of

    if not (dist.is_available() and dist.is_initialized()):
        return torch.ones_like(keys, dtype=torch.bool)
    return owner_of(keys, dist.get_world_size()) == dist.get_rank()


def table_entries(model, name: str) -> dict[int, torch.Tensor]:
    """{key: full row} of logical table ``name``."""
    storage, tag = model.embedding.table_locations()[name]
    table = model.embedding.dynamic_tables()[storage]
    entries = {}
    for keys, tags, rows, _ in table.export_state(1 << 16):
        tags = torch.zeros_like(keys) if tags is None else tags
        for key, t, row in zip(keys.tolist(), tags.tolist(), rows):
            if t == tag:
                entries[key] = row.clone()
    return entries

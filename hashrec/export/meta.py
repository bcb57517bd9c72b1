"""File names of an export directory and the JSON meta of its tensors.

The meta follows the ``is_hashmap`` format of serving platforms that build a
hash table from a (keys, values) pair instead of loading a dense matrix. One
entry per exported item, keyed by the item's name::

    "user_id": {"name": "user_id.values/part_0_1", "dense": false,
                "dimension": 16, "dtype": "float32", "shape": [298731, 16],
                "is_hashmap": true, "hashmap_key": "user_id.keys/part_0_1",
                "hashmap_value": "user_id.values/part_0_1",
                "hashmap_key_dtype": "int64"}

Dense network tensors have ``dense: true``; dense embedding tables are
``dense: false`` matrices (``is_hashmap: false``) of their embedding columns.
``dtype`` is the tensor's: a table's values are in the dtype it stores its rows in
(``float16`` / ``bfloat16`` for a feature's ``data_type``, else ``float32``).
"""

from __future__ import annotations

import torch

PIPELINE_CONFIG_FILE = "pipeline.config"
SCRIPTED_MODEL_FILE = "scripted_model.pt"
# A match model's tower exported alone (``<export_dir>/user``, ``/item``): which tower it is,
# what it reads and gives (``hashrec.export.towers``).
TOWER_META_FILE = "tower.json"


def part_stem(rank: int, world_size: int) -> str:
    """``model-<rank>-of-<world_size>`` with six-digit numbers."""
    return f"model-{rank:06d}-of-{world_size:06d}"


def weights_file(rank: int, world_size: int) -> str:
    return part_stem(rank, world_size) + ".safetensors"


def meta_file(rank: int, world_size: int) -> str:
    return part_stem(rank, world_size) + ".json"


def hashmap_tensor_names(table: str, rank: int, world_size: int) -> tuple[str, str]:
    """(keys name, values name) of a dynamic table's part on ``rank``."""
    part = f"part_{rank}_{world_size}"
    return f"{table}.keys/{part}", f"{table}.values/{part}"


def dense_table_tensor_name(table: str) -> str:
    return f"{table}.weight"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _dimension(shape: tuple[int, ...]) -> int:
    return int(shape[-1]) if len(shape) >= 1 else 1


def tensor_entry(name: str, dtype: torch.dtype, shape: tuple[int, ...], dense: bool) -> dict:
    """Meta entry of a plain tensor (dense network parameter or dense embedding table)."""
    return {"name": name, "dense": dense, "dimension": _dimension(shape),
            "dtype": dtype_name(dtype), "shape": [int(s) for s in shape], "is_hashmap": False}


def hashmap_entry(table: str, rank: int, world_size: int, num_keys: int, dim: int,
                  dtype: torch.dtype = torch.float32) -> dict:
    """Meta entry of one rank's part of a dynamic table (keys int64, values (num_keys, dim))."""
    keys, values = hashmap_tensor_names(table, rank, world_size)
    return {"name": values, "dense": False, "dimension": int(dim), "dtype": dtype_name(dtype),
            "shape": [int(num_keys), int(dim)], "is_hashmap": True, "hashmap_key": keys,
            "hashmap_value": values, "hashmap_key_dtype": "int64"}

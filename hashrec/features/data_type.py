"""A feature's ``data_type`` (TorchEasyRec's embedding storage type) as a torch dtype.

``data_type`` says in which type the feature's table stores its rows: the
embedding and the sparse optimizer's state columns alike. ``FP32`` (the
default), ``FP16`` or ``BF16``; the table's lookups still return float32 rows
to the model, and its sparse updates compute in float32 and store the result
rounded to the table's type. Features sharing a table must agree on it.
"""

from __future__ import annotations

import torch

from hashrec.config.errors import ConfigError

DATA_TYPES = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}


def data_type_of(cfg, feature: str) -> torch.dtype:
    """The dtype named by a feature config's ``data_type`` (``FP32`` when unset).

    Raises:
        ConfigError: naming the feature, for a value other than FP32, FP16 or BF16.
    """
    dtype = DATA_TYPES.get(cfg.data_type)
    if dtype is None:
        raise ConfigError(f"feature {feature!r}: data_type {cfg.data_type!r} is not supported; "
                          f"allowed: {', '.join(DATA_TYPES)}")
    return dtype


def data_type_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"FP16"`` (the config's name of a table dtype)."""
    for name, value in DATA_TYPES.items():
        if value == dtype:
            return name
    return str(dtype).removeprefix("torch.")

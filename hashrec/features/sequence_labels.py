"""Label columns of one value per candidate: dlrm_hstu's (TorchEasyRec's
``cand_seq__action_weight``), a list a row, read as (B, K) float32.

A row's list is a ``list<>`` cell or a text cell split on its candidate sequence's
``sequence_delim``; its first K values are kept (as its candidate sequence keeps its
first K items), the rest of the row is 0. An empty or null cell is a row without
candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from hashrec.config.errors import ConfigError
from hashrec.features.errors import FeatureError
from hashrec.features.tokens import sequence_items

# The models whose label columns hold a list a row (one value per candidate).
SEQUENCE_LABEL_MODELS = ("dlrm_hstu",)
# The feature group of those models' candidates.
CANDIDATE_GROUP = "candidate"


@dataclass(frozen=True)
class SequenceLabel:
    """How to read one label column of a list a row."""

    # K: the values kept a row (the candidate sequence's sequence_length).
    length: int
    # The delimiter of a text cell's values (the candidate sequence's sequence_delim).
    delimiter: str = ";"

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"SequenceLabel.length={self.length}; allowed: 1 or more (the "
                             f"candidate slots a row)")
        if not self.delimiter:
            raise ValueError("SequenceLabel.delimiter is empty; allowed: the sequence's "
                             "sequence_delim")


def sequence_labels(model_config, features, label_fields) -> dict[str, SequenceLabel]:
    """Label column -> how to read it, for a model whose labels are a list a row (every
    label field; ``SEQUENCE_LABEL_MODELS``), else {}: K and the delimiter of the
    candidate group's first sequence feature.

    Raises:
        ConfigError: the model has no candidate group, or it names no sequence feature.
    """
    if model_config is None or model_config.WhichOneof("model") not in SEQUENCE_LABEL_MODELS:
        return {}
    groups = {g.group_name: g for g in model_config.feature_groups}
    group = groups.get(CANDIDATE_GROUP)
    by_name = {f.name: f for f in features}
    sequences = [by_name[n] for n in (group.feature_names if group is not None else ())
                 if n in by_name and by_name[n].is_sequence]
    if not sequences:
        raise ConfigError(f"model_config.{model_config.WhichOneof('model')}: its labels hold a "
                          f"value per candidate of the feature group {CANDIDATE_GROUP!r}, "
                          f"which is missing or holds no sequence feature; add it (a "
                          f"JAGGED_SEQUENCE group of the candidate sequence's features)")
    first = sequences[0]
    return {name: SequenceLabel(int(first.sequence_length),
                                getattr(first, "separator", None) or ";")
            for name in label_fields}


def read_sequence_label(array: pa.Array, name: str, shape: SequenceLabel) -> torch.Tensor:
    """One label column of a list a row -> (B, K) float32 (see the module docstring);
    FeatureError naming the first row holding a value that is not a finite number."""
    bags = sequence_items(array, f"label {name}", name, shape.delimiter)
    values = bags.values
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        try:
            values = pc.cast(values, pa.float64())
        except pa.ArrowInvalid:
            values = pc.cast(pc.if_else(pc.utf8_is_numeric(values), values, None), pa.float64())
    elif not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
              or pa.types.is_boolean(values.type)):
        raise FeatureError(f"label column {name!r} has items of type {values.type}; expected "
                           f"lists of numbers")
    lengths = np.asarray(bags.lengths, dtype=np.int64)
    numbers = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    if not np.isfinite(numbers).all():  # a null (missing or unreadable) reads as NaN
        row = int(rows[np.flatnonzero(~np.isfinite(numbers))[0]])
        raise FeatureError(f"label column {name!r}", row,
                           f"value {array[row].as_py()!r} holds an item that is not a finite "
                           f"number")
    starts = np.cumsum(lengths) - lengths
    slots = np.arange(len(numbers)) - np.repeat(starts, lengths)
    keep = slots < shape.length
    out = np.zeros((len(lengths), shape.length), dtype=np.float32)
    out[rows[keep], slots[keep]] = numbers[keep]
    return torch.from_numpy(out)

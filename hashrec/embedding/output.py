"""What an embedding collection returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class EmbeddingOutput:
    """Embeddings of one batch.

    Attributes:
        pooled: pooled feature name -> (B, dim) float32.
        sequences: sequence feature name -> (padded (B, max_length, dim) float32,
            lengths (B,) int64); positions at or past a row's length are zeros.
    """

    pooled: dict[str, torch.Tensor] = field(default_factory=dict)
    sequences: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

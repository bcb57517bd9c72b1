"""Sequence padding op: ``gather_padded`` / ``gather_padded_backward`` dispatched by device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signatures.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.sequence import reference
from hashrec.table.ops.dispatch import backend


def gather_padded(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  max_length: int) -> torch.Tensor:
    """Gathers sequences of rows: -> (B, max_length, D) float32, zero padded."""
    impl = backend(__name__, reference, rows.device)
    return impl.gather_padded(rows, inverse, offsets, max_length)


def gather_padded_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                           num_rows: int) -> torch.Tensor:
    """Gradient per unique row: (B, L, D) -> (num_rows, D) float32."""
    impl = backend(__name__, reference, grad_out.device)
    return impl.gather_padded_backward(grad_out, inverse, offsets, num_rows)


__all__ = ["gather_padded", "gather_padded_backward"]

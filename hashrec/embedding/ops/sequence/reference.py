"""Padded sequences of rows from deduplicated rows, in pure PyTorch.

Shapes: ``rows`` (U, D) unique rows; ``inverse`` (n,) row of each id;
``offsets`` (B + 1,) delimit the B sequences, each at most ``max_length`` long
(the caller truncates); the output is (B, max_length, D) with zeros past each
sequence's end.
"""

from __future__ import annotations

import torch


def _positions(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = offsets[1:] - offsets[:-1]
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)
    col = torch.arange(seq.numel(), device=offsets.device) - offsets[:-1].index_select(0, seq)
    return seq, col


def gather_padded(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  max_length: int) -> torch.Tensor:
    """Gathers sequences: -> (B, max_length, D) float32, zero padded."""
    seq, col = _positions(offsets)
    batch = offsets.numel() - 1
    out = torch.zeros(batch * max_length, rows.shape[1], dtype=torch.float32, device=rows.device)
    out.index_copy_(0, seq * max_length + col, rows.index_select(0, inverse).float())
    return out.view(batch, max_length, rows.shape[1])


def gather_padded_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                           num_rows: int) -> torch.Tensor:
    """Gradient of ``gather_padded`` w.r.t. ``rows``: (B, L, D) -> (U, D), summed per row."""
    seq, col = _positions(offsets)
    batch, max_length, dim = grad_out.shape
    flat = grad_out.reshape(batch * max_length, dim).float()
    out = torch.zeros(num_rows, dim, dtype=torch.float32, device=grad_out.device)
    out.index_add_(0, inverse, flat.index_select(0, seq * max_length + col))
    return out

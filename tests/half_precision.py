"""Test helper: distances between float16 / bfloat16 tensors in units in the last place."""

from __future__ import annotations

import torch


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between ``a`` and ``b`` in units in the last place of their
    16-bit dtype (1: neighbouring values; +0 and -0 are 0 apart)."""
    def ordered(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16)
    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0

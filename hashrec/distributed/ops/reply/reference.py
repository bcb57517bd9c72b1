"""PyTorch reference of the reply ops (CPU path and oracle of the Triton kernels)."""

from __future__ import annotations

import torch


def pack_reply(values: torch.Tensor, slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Owner side: the reply to each received key.

    Args:
        values: (u, dim) rows the owner looked up.
        slots: (u,) int64 their slots (-1: not stored).
        index: (m,) int64 row of ``values`` answering each received key.

    Returns:
        (m, dim + 1) float32: ``values[index]``, then 1.0 where the key is stored, else 0.0.
    """
    stored = (slots >= 0).to(torch.float32).unsqueeze(1)
    return torch.cat([values.float(), stored], 1)[index]


def unpack_reply(rows: torch.Tensor, order: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Requester side: replies in the order the keys left -> the caller's key order.

    Args:
        rows: (n, dim + 1) float32 replies, grouped by owner as the keys were sent.
        order: (n,) int64 position in the caller's keys of each sent key.

    Returns:
        values (n, dim) float32 and stored (n,) bool, in the caller's key order.
    """
    answered = torch.empty_like(rows)
    answered[order] = rows
    return answered[:, :-1].contiguous(), answered[:, -1] > 0.5

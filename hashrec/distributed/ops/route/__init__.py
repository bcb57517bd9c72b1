"""Routing of a rank's keys to their owners, dispatched by device.

``route_columns`` finds each key's owner (``hashrec.table.hashing.owner_of``) and
lays the keys and their per-key integers out as the rows of one int64 matrix,
grouped by owner (stable): what the key exchange sends; ``owner_counts`` counts the
keys each rank owns (the dedup's sizes of a sharded storage). See ``reference.py`` for
shapes and semantics; ``triton.py`` (CUDA) has the same signature.
"""

from __future__ import annotations

import torch

from hashrec.distributed.ops.route import reference
from hashrec.table.ops.dispatch import backend


def route_columns(keys: torch.Tensor, extras: list[torch.Tensor], world_size: int,
                  send_counts: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(order (n,), columns (n, 1 + len(extras)) int64, send_counts (world_size,) int64
    or None when not asked)."""
    impl = backend(__name__, reference, keys.device)
    return impl.route_columns(keys, extras, world_size, send_counts)


def owner_counts(keys: torch.Tensor, mask: torch.Tensor, world_size: int) -> torch.Tensor:
    """(world_size,) int64 keys where ``mask`` (n,) bool, per owning rank."""
    impl = backend(__name__, reference, keys.device)
    return impl.owner_counts(keys, mask, world_size)


__all__ = ["owner_counts", "route_columns"]

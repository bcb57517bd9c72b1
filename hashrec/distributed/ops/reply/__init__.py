"""The rows a sharded lookup sends back, dispatched by device.

An owner replies to every key it received with the key's row and a stored flag
(``pack_reply``); the requester puts the replies back in its own key order and
splits off the flags (``unpack_reply``). See ``reference.py`` for shapes and
semantics; ``triton.py`` (CUDA) has the same signatures.
"""

from __future__ import annotations

import torch

from hashrec.distributed.ops.reply import reference
from hashrec.table.ops.dispatch import backend


def pack_reply(values: torch.Tensor, slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(m, dim + 1) float32: ``values[index]`` and a last column 1.0 where ``slots[index] >= 0``."""
    impl = backend(__name__, reference, values.device)
    return impl.pack_reply(values, slots, index)


def unpack_reply(rows: torch.Tensor, order: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (n, dim) float32, stored (n,) bool), row i of ``rows`` put at ``order[i]``."""
    impl = backend(__name__, reference, rows.device)
    return impl.unpack_reply(rows, order)


__all__ = ["pack_reply", "unpack_reply"]

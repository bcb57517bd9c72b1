"""Repeats among the keys an owner receives, dispatched by device.

The keys of a sharded lookup reach their owner as one run per sender; each run is
free of repeats and, when the senders deduplicated by sorting, sorted by (tag, key).
``first_in_runs`` finds each key's first occurrence across the runs. See
``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.distributed.ops.merge import reference
from hashrec.table.ops.dispatch import backend


def first_in_runs(keys: torch.Tensor, tags: torch.Tensor | None, runs: list[int],
                  bounds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rep (m,) int64: first position of each position's (key, tag); active (m,) bool).

    ``bounds``: the runs' (len(runs) + 1,) int64 starts on the keys' device when the
    caller keeps them there (a captured graph reads them; nothing is copied)."""
    impl = backend(__name__, reference, keys.device)
    return impl.first_in_runs(keys, tags, runs, bounds)


__all__ = ["first_in_runs"]

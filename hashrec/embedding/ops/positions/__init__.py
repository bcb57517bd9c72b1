"""Where each id of concatenated bags sends its gradient: ``gradient_rows`` dispatched by
device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.positions import reference
from hashrec.table.ops.dispatch import backend


def gradient_rows(lengths: torch.Tensor, first: torch.Tensor, sequence: torch.Tensor,
                  n: int, order: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per id of the bags laid end to end: (row of its output gradient (n,), bag (n,));
    with ``order`` (n,), entry q is id ``order[q]``'s."""
    impl = backend(__name__, reference, lengths.device)
    return impl.gradient_rows(lengths, first, sequence, n, order)


__all__ = ["gradient_rows"]

"""Fused training-step kernels: dedup once, pool straight from table rows, and reduce
gradients per unique key into the sparse optimizer update (CUDA via Triton).

``dedup`` is plain PyTorch and runs anywhere; the kernels live in ``triton.py``.
"""

from hashrec.embedding.ops.fused.dedup import Dedup, bag_of_positions, dedup, group_positions

__all__ = ["Dedup", "bag_of_positions", "dedup", "group_positions"]

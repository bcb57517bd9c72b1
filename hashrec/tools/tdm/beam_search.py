"""Layer-wise beam search of a TDM tree, as TorchEasyRec's retrieval does it.

For a block of B users, every node of the first searched level is scored for every user;
each user keeps the ``beam_size`` best nodes of a level, and their children are the next
level's candidates; on the last level (the items) each user's ``recall_num`` best
candidates are retrieved, best first. The first searched level is the first whose node
count reaches ``beam_size * n_cluster`` (TorchEasyRec's ``first_recall_layer``, the least
``l`` with ``n_cluster ** l >= 2 * n_cluster * recall_num``, for its beam of
``2 * recall_num`` on a full tree), or the last level where none above it does: above it
a beam would keep nearly every node.

The search runs on the device of the children table, in fixed shapes: a level's
candidates are (B, K), K the first level's node count, then ``min(beam_size, K) *
n_cluster``; a missing child (a node with fewer than ``n_cluster``) is -1, is scored as
row 0 (every call scores B x K pairs) and is never kept. Candidates of equal scores are
kept in candidate order (children in their parents' order), on every device alike.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# scorer(user_index (M,) int64, node_rows (M,) int64) -> scores (M,) float, higher better
Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def first_search_level(level_sizes: list[int], beam_size: int, n_cluster: int) -> int:
    """The first level searched (see the module docstring); ``level_sizes[l]`` is the node
    count of level ``l``, the last level the items'."""
    last = len(level_sizes) - 1
    return next((lv for lv in range(1, last) if level_sizes[lv] >= beam_size * n_cluster),
                last)


def beam_search(children: torch.Tensor, first_rows: torch.Tensor, levels: int, users: int,
                scorer: Scorer, beam_size: int, recall_num: int) -> torch.Tensor:
    """The ``recall_num`` best items of each of ``users`` users, best first.

    Args:
        children: (n, n_cluster) int64 rows of each node's children, -1 after the last.
        first_rows: (K,) int64 rows of the first searched level's nodes.
        levels: the levels searched, the first's included (1: ``first_rows`` are the
            items).
        users: B, the users of the block (``scorer``'s ``user_index`` is into them).
        scorer: scores of (user, node) pairs (see ``Scorer``), on ``children``'s device.
        beam_size: nodes kept per user on each level above the items.
        recall_num: items retrieved per user.

    Returns:
        (B, recall_num) int64 rows of the items; -1 after the last where fewer items are
        below the kept nodes.
    """
    if beam_size < 1 or recall_num < 1 or levels < 1:
        raise ValueError(f"beam_size={beam_size}, recall_num={recall_num}, levels={levels}: "
                         f"each must be 1 or more")
    candidates = first_rows.to(children.device).unsqueeze(0).expand(users, -1)
    for _ in range(levels - 1):
        kept = _best(candidates, scorer, beam_size)
        candidates = children[kept.clamp(min=0)].masked_fill(
            (kept < 0).unsqueeze(2), -1).reshape(users, -1)
    kept = _best(candidates, scorer, recall_num)
    return torch.nn.functional.pad(kept, [0, recall_num - kept.shape[1]], value=-1)


def _best(candidates: torch.Tensor, scorer: Scorer, keep: int) -> torch.Tensor:
    """(B, min(keep, K)) the best of the (B, K) ``candidates`` rows of each user, best
    first; -1 for a missing candidate."""
    users, width = candidates.shape
    user_index = torch.arange(users, device=candidates.device).unsqueeze(1).expand(-1, width)
    scores = scorer(user_index.reshape(-1), candidates.clamp(min=0).reshape(-1))
    scores = scores.reshape(users, width).float().masked_fill(candidates < 0, float("-inf"))
    # a stable sort, not topk: nodes of equal scores (a model may score nodes it never saw
    # in training alike) are kept in candidate order, the same on every device
    best, at = scores.sort(dim=1, descending=True, stable=True)
    best, at = best[:, :keep], at[:, :keep]
    return candidates.gather(1, at).masked_fill(best == float("-inf"), -1)


def recall_hits(retrieved_ids: np.ndarray, clicked_ids: np.ndarray) -> np.ndarray:
    """(B,) whether each row's clicked item id is among its retrieved ids (B, k)."""
    return (retrieved_ids == clicked_ids[:, None]).any(axis=1)

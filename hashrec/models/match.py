"""A match model's towers and similarities, shared by the model and its exported
TorchScript form (``hashrec.export.scripted.heads``), so that the two cannot drift apart.

No ``from __future__ import annotations`` here: TorchScript reads these annotations as
types.
"""

import torch
from torch import nn


class MatchTower(nn.Module):
    """A group's (B, width) -> its MLP -> a linear layer to ``output_dim`` (none where
    ``output_dim`` is 0) -> (B, D) embeddings, L2-normalized rows where ``cosine``."""

    cosine: bool

    def __init__(self, mlp: nn.Module, output_dim: int, cosine: bool) -> None:
        super().__init__()
        self.mlp = mlp
        width = mlp.output_dim()
        self.output = nn.Linear(width, output_dim) if output_dim > 0 else nn.Identity()
        self.cosine = cosine
        self.dim = output_dim if output_dim > 0 else width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.output(self.mlp(x))
        if self.cosine:
            out = nn.functional.normalize(out, p=2.0, dim=1)
        return out


def batch_similarity(user: torch.Tensor, item: torch.Tensor, in_batch: bool) -> torch.Tensor:
    """Users (B, D) against items (B + N, D): the batch's B items (row i's positive first)
    then N sampled negatives.

    Returns:
        ``in_batch``: (B, B + N), row i against every item (its positive at column i);
        else (B, 1 + N), row i against its own item (column 0) then the N negatives.
    """
    if in_batch:
        return user @ item.t()
    rows = user.shape[0]
    positive = (user * item[:rows]).sum(dim=-1, keepdim=True)
    return torch.cat([positive, user @ item[rows:].t()], dim=-1)


def pair_similarity(user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
    """Each row's user against the row's item: (B, D) x (B, D) -> (B,)."""
    return (user * item).sum(dim=-1)

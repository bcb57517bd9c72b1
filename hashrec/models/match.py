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


def batch_similarity(user: torch.Tensor, item: torch.Tensor, in_batch: bool,
                     hard: torch.Tensor | None = None) -> torch.Tensor:
    """Users (B, D) against items (B + N, D): the batch's B items (row i's positive first)
    then N sampled negatives; with ``hard`` (B, H) bool, items (B + N + B * H, D), the
    last B * H each row's H hard-negative slots (row i's at B + N + i * H + j), ``hard``
    telling the filled ones.

    Returns:
        ``in_batch``: (B, B + N), row i against every item (its positive at column i);
        else (B, 1 + N), row i against its own item (column 0) then the N negatives;
        with ``hard``, H more columns: row i against its own hard negatives, -inf in the
        empty slots (a softmax gives them nothing, a top-k ranks them last).
    """
    rows = user.shape[0]
    if hard is not None:
        slots = hard.shape[1]
        shared = item.shape[0] - rows * slots
        own = item[shared:].reshape(rows, slots, -1)
        own_similarity = (user.unsqueeze(1) * own).sum(dim=-1)
        own_similarity = own_similarity.masked_fill(torch.logical_not(hard), float("-inf"))
        return torch.cat([batch_similarity(user, item[:shared], in_batch), own_similarity],
                         dim=-1)
    if in_batch:
        return user @ item.t()
    positive = (user * item[:rows]).sum(dim=-1, keepdim=True)
    return torch.cat([positive, user @ item[rows:].t()], dim=-1)


def hard_negative_input(batch) -> tuple[torch.Tensor, ...]:
    """What a match model's ``dense_inputs`` ends with: the batch's hard-negative mask
    (B, H) bool (``Batch.hard_negatives``), or nothing without hard negatives."""
    hard = batch.hard_negatives
    return () if hard is None else (hard,)


def split_hard_negatives(inputs: tuple[torch.Tensor, ...]
                         ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """A match model's ``dense_inputs`` -> (the towers' inputs, the hard-negative mask or
    None): the mask is the last input, the only bool one (the towers' are float
    embeddings and integer lengths)."""
    if len(inputs) and inputs[-1].dtype == torch.bool:
        return inputs[:-1], inputs[-1]
    return inputs, None


def amm_rows(augment: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DAT's adaptive-mimic term of each row (B,): the squared distance, summed over the
    D dimensions, of the row's augment vector L2-normalized (B, D) and the other tower's
    embedding of the row (B, D), detached: the term trains the augment vector alone,
    never the tower it mimics."""
    mimic = nn.functional.normalize(augment.float(), p=2.0, dim=1)
    return (mimic - target.detach().float()).square().sum(dim=1)


def pair_similarity(user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
    """Each row's user against the row's item: (B, D) x (B, D) -> (B,)."""
    return (user * item).sum(dim=-1)


class MINDUserTower(nn.Module):
    """MIND's user tower (``hashrec.models.mind``): the user's features (B, Du) through
    ``user_mlp`` (B, U); the behaviour sequence (B, L, Ds) through ``hist_mlp`` and the
    capsule layer (``hashrec.modules.capsule``) to interests (B, K, H); each interest
    beside the user's vector through ``concat_mlp`` and ``output`` (a linear layer to
    ``output_dim``, or none) to (B, K, D), L2-normalized rows where ``cosine``.

    Returns (interests (B, K, D), mask (B, K) bool): the interests beyond a user's count
    (mask False) are zero.
    """

    cosine: bool

    def __init__(self, user_mlp: nn.Module, hist_mlp: nn.Module, capsule: nn.Module,
                 concat_mlp: nn.Module, output: nn.Module, cosine: bool, dim: int) -> None:
        super().__init__()
        self.user_mlp = user_mlp
        self.hist_mlp = hist_mlp
        self.capsule = capsule
        self.concat_mlp = concat_mlp
        self.output = output
        self.cosine = cosine
        self.dim = dim

    def forward(self, user: torch.Tensor, sequence: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        capsules, mask = self.capsule(self.hist_mlp(sequence), lengths)
        vector = self.user_mlp(user).to(capsules.dtype)
        tiled = vector.unsqueeze(1).expand(-1, capsules.shape[1], -1)
        interests = self.output(self.concat_mlp(torch.cat([tiled, capsules], dim=-1)))
        if self.cosine:
            interests = nn.functional.normalize(interests, p=2.0, dim=-1)
        return interests * mask.unsqueeze(-1).to(interests.dtype), mask


def label_aware_attention(interests: torch.Tensor, mask: torch.Tensor, item: torch.Tensor,
                          power: float) -> torch.Tensor:
    """MIND's label-aware attention: interests (B, K, D) of which ``mask`` (B, K) are the
    user's, each row's item (B, D) -> (B, D), the interests weighed by the softmax over
    the user's interests of ``power`` x (interest . item) (TorchEasyRec's form of the
    paper's power)."""
    scores = power * torch.einsum("bkd,bd->bk", interests, item.to(interests.dtype))
    scores = scores.masked_fill(torch.logical_not(mask), -1e9)
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bk,bkd->bd", weights, interests)


class BackboneMatchTower(nn.Module):
    """A match backbone's tower (``hashrec.models.match_backbone``): its feature groups'
    tensors -> ``backbone`` (the tower's blocks alone) -> its output block's (B, width)
    -> a linear layer to ``output_dim`` where width differs from it (none where equal, or
    where ``output_dim`` is 0) -> (B, D) embeddings, L2-normalized rows where ``cosine``."""

    cosine: bool

    def __init__(self, backbone: nn.Module, width: int, output_dim: int, cosine: bool) -> None:
        super().__init__()
        self.backbone = backbone
        project = output_dim > 0 and output_dim != width
        self.output = nn.Linear(width, output_dim) if project else nn.Identity()
        self.cosine = cosine
        self.dim = output_dim if output_dim > 0 else width

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        out = self.output(self.backbone(inputs)[0])
        if self.cosine:
            out = nn.functional.normalize(out, p=2.0, dim=1)
        return out

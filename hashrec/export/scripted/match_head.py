"""The scripted dense network of a match model (DSSM, DAT, MIND, the match backbone; HSTU
match's in ``hstu_head``): both
towers over a row's user and item groups (a DAT tower's augment group after its group; a
match backbone's tower over its groups as its backbone reads them), whose output the
inference model splits into ``user_tower_emb``,
``item_tower_emb`` and the row's pair ``similarity`` (``InferenceModel``); or one tower
alone over its own group (``TowerHead``), for the tower's own export, whose output is
``<tower>_tower_emb``. MIND's user tower gives its K interests (B, K, D)."""

import torch
from torch import nn

from hashrec.export.scripted.heads import BackboneHead, DeepGroup, SequenceGroup, Tensors
from hashrec.export.scripted.hstu_head import hstu_head
from hashrec.models import MIND, HSTUMatch, MatchBackbone
from hashrec.models.match import label_aware_attention, pair_similarity


class TowerInput(nn.Module):
    """The DEEP groups of a match model's tower (``MatchModel.tower_groups``) side by side:
    (B, sum of their widths), its network's input."""

    def __init__(self, model, tower: str) -> None:
        super().__init__()
        self.groups = nn.ModuleList([DeepGroup(group, model)
                                     for group in model.tower_groups(tower)])

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for group in self.groups:
            outputs.append(group(pooled, sequences, sequence_lengths, dense, sequence_dense))
        return torch.cat(outputs, dim=-1)


class MatchHead(nn.Module):
    """Inputs as every head -> (B, 2 D + 1): the user embedding, the item embedding, then
    their similarity over the temperature. The towers' heads are ``tower_head``'s unless
    given (``user``, ``item``: heads of the same inputs)."""

    temperature: float

    def __init__(self, model, user: nn.Module | None = None,
                 item: nn.Module | None = None) -> None:
        super().__init__()
        self.user = user if user is not None else tower_head(model, "user")
        self.item = item if item is not None else tower_head(model, "item")
        self.temperature = float(model.temperature)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        user = self.user(pooled, sequences, sequence_lengths, dense, sequence_dense)
        item = self.item(pooled, sequences, sequence_lengths, dense, sequence_dense)
        similarity = pair_similarity(user, item) / self.temperature
        return torch.cat([user, item, similarity.unsqueeze(-1)], dim=-1)


class TowerHead(nn.Module):
    """One tower of a match model alone (``tower``: "user" or "item"): its groups' inputs
    -> (B, D) embeddings; it reads nothing of the other tower's groups."""

    def __init__(self, model, tower: str) -> None:
        super().__init__()
        self.group = TowerInput(model, tower)
        self.tower = getattr(model, f"{tower}_tower")

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        return self.tower(self.group(pooled, sequences, sequence_lengths, dense,
                                     sequence_dense))


def tower_head(model, tower: str) -> nn.Module:
    """``tower`` ("user" or "item") of a match model alone: a match backbone's tower over
    its feature groups as its backbone reads them (``BackboneHead``: a SEQUENCE group's
    three tensors, a DEEP group's (B, D)), another model's over its DEEP groups side by
    side (``TowerHead``)."""
    if isinstance(model, MatchBackbone):
        return BackboneHead(model.tower_groups(tower), getattr(model, f"{tower}_tower"), model)
    return TowerHead(model, tower)


class InterestsTower(nn.Module):
    """MIND's user tower over its user group and behaviour sequence -> its interests
    (B, K, D) (zero beyond a user's count) and their mask (B, K)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.user_group = DeepGroup(model.user_group, model)
        self.history_group = SequenceGroup(model.history_group)
        self.tower = model.user_tower

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors
                ) -> tuple[torch.Tensor, torch.Tensor]:
        user = self.user_group(pooled, sequences, sequence_lengths, dense, sequence_dense)
        _, sequence, lengths = self.history_group(pooled, sequences, sequence_lengths, dense,
                                                  sequence_dense)
        return self.tower(user, sequence, lengths)


class InterestsHead(nn.Module):
    """MIND's user tower alone -> (B, K, D) interests."""

    def __init__(self, model) -> None:
        super().__init__()
        self.tower = InterestsTower(model)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        interests, _ = self.tower(pooled, sequences, sequence_lengths, dense, sequence_dense)
        return interests


class MultiInterestHead(nn.Module):
    """MIND as a whole -> (B, K D + D + 1): the interests (flat), the item embedding, then
    the similarity of the interests pooled by the item (label-aware attention, as in
    training) and the item, over the temperature."""

    temperature: float
    simi_pow: float
    cosine: bool

    def __init__(self, model) -> None:
        super().__init__()
        self.user = InterestsTower(model)
        self.item_group = DeepGroup(model.item_group, model)
        self.item_tower = model.item_tower
        self.temperature = float(model.temperature)
        self.simi_pow = float(model.simi_pow)
        self.cosine = bool(model.cosine)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        interests, mask = self.user(pooled, sequences, sequence_lengths, dense,
                                    sequence_dense)
        item = self.item_tower(self.item_group(pooled, sequences, sequence_lengths, dense,
                                               sequence_dense))
        user = label_aware_attention(interests, mask, item, self.simi_pow)
        if self.cosine:
            user = nn.functional.normalize(user, p=2.0, dim=-1)
        similarity = pair_similarity(user, item) / self.temperature
        return torch.cat([interests.flatten(1), item, similarity.unsqueeze(-1)], dim=-1)


def match_head(model, tower: str) -> nn.Module:
    """The scriptable network of a match model, or of its ``tower`` ("user", "item")
    alone."""
    if isinstance(model, HSTUMatch):
        return hstu_head(model, tower)
    if isinstance(model, MIND):
        if tower == "user":
            return InterestsHead(model)
        return TowerHead(model, tower) if tower else MultiInterestHead(model)
    return tower_head(model, tower) if tower else MatchHead(model)


def match_outputs(out: torch.Tensor, dim: int, tower: str, interests: int
                  ) -> dict[str, torch.Tensor]:
    """``MatchHead``'s (B, 2 dim + 1) -> its named outputs, as TorchEasyRec names the
    towers' embeddings; a ``TowerHead``'s (B, dim) (``tower`` not "") ->
    ``<tower>_tower_emb``. With ``interests`` K > 0 (MIND) the user's part is K interests:
    ``MultiInterestHead``'s (B, K dim + dim + 1), ``InterestsHead``'s (B, K, dim)."""
    if tower != "":
        return {tower + "_tower_emb": out}
    users = max(interests, 1) * dim
    user = out[:, :users]
    if interests > 0:
        user = user.reshape(out.shape[0], interests, dim)
    return {"user_tower_emb": user, "item_tower_emb": out[:, users:users + dim],
            "similarity": out[:, users + dim]}

"""The scripted dense network of a match model (DSSM): both towers over a row's user and
item groups, whose output the inference model splits into ``user_tower_emb``,
``item_tower_emb`` and the row's pair ``similarity`` (``InferenceModel``); or one tower
alone over its own group (``TowerHead``), for the tower's own export, whose output is
``<tower>_tower_emb``."""

import torch
from torch import nn

from hashrec.export.scripted.heads import DeepGroup, Tensors
from hashrec.models.match import pair_similarity


class MatchHead(nn.Module):
    """Inputs as every head -> (B, 2 D + 1): the user embedding, the item embedding, then
    their similarity over the temperature."""

    temperature: float

    def __init__(self, model) -> None:
        super().__init__()
        self.user_group = DeepGroup(model.user_group, model)
        self.item_group = DeepGroup(model.item_group, model)
        self.user_tower = model.user_tower
        self.item_tower = model.item_tower
        self.temperature = float(model.temperature)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        user = self.user_tower(self.user_group(pooled, sequences, sequence_lengths, dense,
                                               sequence_dense))
        item = self.item_tower(self.item_group(pooled, sequences, sequence_lengths, dense,
                                               sequence_dense))
        similarity = pair_similarity(user, item) / self.temperature
        return torch.cat([user, item, similarity.unsqueeze(-1)], dim=-1)


class TowerHead(nn.Module):
    """One tower of a match model alone (``tower``: "user" or "item"): its group's inputs
    -> (B, D) embeddings; it reads nothing of the other tower's group."""

    def __init__(self, model, tower: str) -> None:
        super().__init__()
        self.group = DeepGroup(getattr(model, f"{tower}_group"), model)
        self.tower = getattr(model, f"{tower}_tower")

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        return self.tower(self.group(pooled, sequences, sequence_lengths, dense,
                                     sequence_dense))


def match_outputs(out: torch.Tensor, dim: int, tower: str) -> dict[str, torch.Tensor]:
    """``MatchHead``'s (B, 2 dim + 1) -> its named outputs, as TorchEasyRec names the
    towers' embeddings; a ``TowerHead``'s (B, dim) (``tower`` not "") ->
    ``<tower>_tower_emb``."""
    if tower != "":
        return {tower + "_tower_emb": out}
    return {"user_tower_emb": out[:, :dim], "item_tower_emb": out[:, dim:2 * dim],
            "similarity": out[:, 2 * dim]}

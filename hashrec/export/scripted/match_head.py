"""The scripted dense network of a match model (DSSM): both towers over a row's user and
item groups; the inference model splits its output into ``user_tower_emb``,
``item_tower_emb`` and the row's pair ``similarity`` (``InferenceModel``)."""

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


def match_outputs(out: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """``MatchHead``'s (B, 2 dim + 1) -> its named outputs, as TorchEasyRec names the
    towers' embeddings."""
    return {"user_tower_emb": out[:, :dim], "item_tower_emb": out[:, dim:2 * dim],
            "similarity": out[:, 2 * dim]}

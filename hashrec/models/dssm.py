"""DSSM: TorchEasyRec's two-tower match (retrieval) model.

A user tower and an item tower, each an MLP over its DEEP feature group and a linear
layer to ``output_dim``, embed users and items; COSINE similarity normalizes both
embeddings first, INNER_PRODUCT takes them as they are; similarities are divided by
``temperature``. Each row's user is trained to pick the row's item among negatives by a
softmax cross entropy: the sampled items of ``data_config.negative_sampler`` (the batch
holds them after its B rows: ``Batch.negatives``), and with ``in_batch_negative`` the
batch's other items too. The output ``similarity`` is (B, 1 + N) (column 0 the row's
item) or, in-batch, (B, B + N) (column i row i's item); see ``MatchModel``.

``dssm_v2`` (TorchEasyRec's towers sharing one embedding lookup) is the same model here:
HashRec looks every feature up once for the whole model.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.group_encoders import input_count
from hashrec.models.match import batch_similarity, hard_negative_input, split_hard_negatives
from hashrec.models.match_model import MatchModel


class DSSM(MatchModel):
    """See the module docstring; arguments as ``RankModel``."""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = getattr(model_config, self.kind)
        self.user_group = self._tower_group(config.user_tower.input, "user_tower")
        self.item_group = self._tower_group(config.item_tower.input, "item_tower")
        self._check_groups_read([self.user_group.name, self.item_group.name])
        self.user_tower = self._mlp_tower(config.user_tower, "user_tower", self.user_group.dim)
        self.item_tower = self._mlp_tower(config.item_tower, "item_tower", self.item_group.dim)
        self._check_widths(self.user_tower.dim, self.item_tower.dim)
        self._user_inputs = input_count(self.user_group, self.sequence_encoders)

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The user group's tensors over the batch's B rows, then the item group's over its
        B + N rows (the sampled negatives' after the batch's items)."""
        rows = batch.batch_size
        user = self.group_inputs([self.user_group], embedded, batch)
        item = self.group_inputs([self.item_group], embedded, batch)
        return (*(t[:rows] for t in user), *item, *hard_negative_input(batch))

    def embeddings(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``dense_inputs`` -> (user embeddings (B, D), item embeddings (B + N, D))."""
        at = self._user_inputs
        (user,) = self.groups_from_inputs([self.user_group], inputs[:at])
        (item,) = self.groups_from_inputs([self.item_group], inputs[at:])
        return self.user_tower(user), self.item_tower(item)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature: (B, 1 + N), or in-batch
        (B, B + N)."""
        inputs, hard = split_hard_negatives(inputs)
        user, item = self.embeddings(*inputs)
        return batch_similarity(user, item, self.in_batch_negative, hard) / self.temperature

"""DSSM: TorchEasyRec's two-tower match (retrieval) model.

A user tower and an item tower, each an MLP over its DEEP feature group and a linear
layer to ``output_dim``, embed users and items; COSINE similarity normalizes both
embeddings first, INNER_PRODUCT takes them as they are; similarities are divided by
``temperature``. Each row's user is trained to pick the row's item among negatives by a
softmax cross entropy: the sampled items of ``data_config.negative_sampler`` (the batch
holds them after its B rows: ``Batch.negatives``), and with ``in_batch_negative`` the
batch's other items too. The output ``similarity`` is (B, 1 + N) (column 0 the row's
item) or, in-batch, (B, B + N) (column i row i's item).

``dssm_v2`` (TorchEasyRec's towers sharing one embedding lookup) is the same model here:
HashRec looks every feature up once for the whole model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP
from hashrec.models.group_encoders import input_count
from hashrec.models.losses import match_loss
from hashrec.models.match import MatchTower, batch_similarity
from hashrec.models.mlp_config import mlp_options
from hashrec.models.rank_model import RankModel
from hashrec.modules import MLP

# Similarity enum values of model.proto.
_COSINE, _INNER_PRODUCT = 0, 1


class DSSM(RankModel):
    """See the module docstring; arguments as ``RankModel``."""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        self.kind = model_config.WhichOneof("model")
        config = getattr(model_config, self.kind)
        if config.similarity not in (_COSINE, _INNER_PRODUCT):
            raise ModelError(f"{self.kind}.similarity: only COSINE and INNER_PRODUCT are "
                             f"supported (as in TorchEasyRec's DSSM)")
        self.temperature = proto_float(config.temperature)
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ModelError(f"{self.kind}.temperature={self.temperature}; allowed: a "
                             f"finite number > 0 (default 1)")
        if config.output_dim < 0:
            raise ModelError(f"{self.kind}.output_dim={config.output_dim}; allowed: 0 (the "
                             f"MLPs' last hidden units) or more")
        self.in_batch_negative = bool(config.in_batch_negative)
        self.user_group = self._tower_group(config.user_tower.input, "user_tower")
        self.item_group = self._tower_group(config.item_tower.input, "item_tower")
        if self.user_group.name == self.item_group.name:
            raise ModelError(f"{self.kind}: user_tower and item_tower both read the feature "
                             f"group {self.user_group.name!r}; give each tower its own group")
        unused = [name for name in self.groups
                  if name not in (self.user_group.name, self.item_group.name)]
        if unused:
            raise ModelError(f"{self.kind}: feature groups {unused} feed no tower and would "
                             f"be left out of the model; remove them")
        cosine = config.similarity == _COSINE
        self.user_tower = self._tower(config.user_tower, "user_tower", self.user_group.dim,
                                      config.output_dim, cosine)
        self.item_tower = self._tower(config.item_tower, "item_tower", self.item_group.dim,
                                      config.output_dim, cosine)
        if self.user_tower.dim != self.item_tower.dim:
            raise ModelError(f"{self.kind}: output_dim 0 leaves the towers' embeddings as "
                             f"their MLPs' last hidden units, {self.user_tower.dim} (user) "
                             f"and {self.item_tower.dim} (item), which must be equal; set "
                             f"output_dim")
        self._user_inputs = input_count(self.user_group, self.sequence_encoders)

    def _tower_group(self, name: str, field: str):
        return self.group(name, DEEP, f"{self.kind}.{field}")

    def _tower(self, tower_config, field: str, width: int, output_dim: int,
               cosine: bool) -> MatchTower:
        where = f"{self.kind}.{field}.mlp"
        return MatchTower(MLP(width, mlp_options(tower_config.mlp, where)), output_dim, cosine)

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The user group's tensors over the batch's B rows, then the item group's over its
        B + N rows (the sampled negatives' after the batch's items)."""
        rows = batch.batch_size
        user = self.group_inputs([self.user_group], embedded, batch)
        item = self.group_inputs([self.item_group], embedded, batch)
        return (*(t[:rows] for t in user), *item)

    def embeddings(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``dense_inputs`` -> (user embeddings (B, D), item embeddings (B + N, D))."""
        at = self._user_inputs
        (user,) = self.groups_from_inputs([self.user_group], inputs[:at])
        (item,) = self.groups_from_inputs([self.item_group], inputs[at:])
        return self.user_tower(user), self.item_tower(item)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature: (B, 1 + N), or in-batch
        (B, B + N)."""
        user, item = self.embeddings(*inputs)
        return batch_similarity(user, item, self.in_batch_negative) / self.temperature

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"similarity": logits}

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           *rest: torch.Tensor) -> dict[str, torch.Tensor]:
        """softmax_cross_entropy of each row's similarities, its positive at column 0 (or
        i, in-batch); a weighted mean with sample weights. ``labels`` are not read."""
        task = self.tasks[0]
        weights = rest[0] if self.weighted else None
        loss = match_loss(logits, task.match, weights, task.loss.label_smoothing)
        return {task.loss_names[0]: loss}

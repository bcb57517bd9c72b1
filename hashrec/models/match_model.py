"""The shared part of TorchEasyRec's match (retrieval) models, DSSM, DAT, MIND and the
match backbone.

Options every match model has (``similarity``, ``temperature``, ``output_dim``,
``in_batch_negative``), its towers' feature groups, its output ``similarity`` (B, 1 + N)
(column 0 the row's item, then the N sampled negatives: ``Batch.negatives``) or, in-batch,
(B, B + N) (column i row i's item), with a hard-negative sampler H more columns (each
row's own hard negatives, -inf in empty slots: ``hashrec.models.match.batch_similarity``),
and its loss: a softmax cross entropy of each row's user picking the row's item
(``hashrec.models.losses.match_loss``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.config.match_params import match_params
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP
from hashrec.models.losses import match_loss
from hashrec.models.match import MatchTower
from hashrec.models.mlp_config import mlp_options
from hashrec.models.rank_model import RankModel
from hashrec.modules import MLP

# Similarity enum values of model.proto.
COSINE, INNER_PRODUCT = 0, 1


class MatchModel(RankModel):
    """Base of the match models; arguments as ``RankModel``. Subclasses build
    ``user_tower`` and ``item_tower`` (whose ``dim`` is their embeddings' width) and set
    ``user_group`` and ``item_group``."""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        self.kind = model_config.WhichOneof("model")
        config = match_params(model_config)
        # where the options are (a match backbone's in its model_params)
        at = f"{self.kind}.model_params" if self.kind == "match_backbone" else self.kind
        if config.similarity not in (COSINE, INNER_PRODUCT):
            raise ModelError(f"{at}.similarity: only COSINE and INNER_PRODUCT are "
                             f"supported (as in TorchEasyRec's match models)")
        self.cosine = config.similarity == COSINE
        self.temperature = proto_float(config.temperature)
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ModelError(f"{at}.temperature={self.temperature}; allowed: a "
                             f"finite number > 0 (default 1)")
        if config.output_dim < 0:
            raise ModelError(f"{at}.output_dim={config.output_dim}; allowed: 0 (the "
                             f"towers' own widths) or more")
        self.output_dim = int(config.output_dim)
        self.in_batch_negative = bool(config.in_batch_negative)

    def tower_groups(self, tower: str) -> list:
        """The DEEP groups whose (B, width) side by side are the input of ``tower``'s
        network (``tower``: "user" or "item"): its ``<tower>_group``, and a DAT's augment
        group after it (what an export of the tower reads)."""
        return [getattr(self, f"{tower}_group")]

    def _tower_group(self, name: str, field: str, group_type: str = DEEP):
        return self.group(name, group_type, f"{self.kind}.{field}")

    def _check_groups_read(self, read: list[str]) -> None:
        """Every feature group is read by a tower, and by one only.

        Raises:
            ModelError: a group read twice or by none.
        """
        twice = sorted({name for name in read if read.count(name) > 1})
        if twice:
            raise ModelError(f"{self.kind}: the towers read the feature group(s) {twice} "
                             f"more than once; give each tower input its own group")
        unused = [name for name in self.groups if name not in read]
        if unused:
            raise ModelError(f"{self.kind}: feature groups {unused} feed no tower and would "
                             f"be left out of the model; remove them")

    def _mlp_tower(self, tower_config, field: str, width: int) -> MatchTower:
        """A tower of ``Tower { input mlp }``: MLP, linear layer to ``output_dim``."""
        where = f"{self.kind}.{field}.mlp"
        return MatchTower(MLP(width, mlp_options(tower_config.mlp, where)), self.output_dim,
                          self.cosine)

    def _check_widths(self, user: int, item: int) -> None:
        if user != item:
            raise ModelError(f"{self.kind}: output_dim 0 leaves the towers' embeddings as "
                             f"their MLPs' last hidden units, {user} (user) and {item} "
                             f"(item), which must be equal; set output_dim")

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

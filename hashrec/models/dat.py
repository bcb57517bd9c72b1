"""DAT: TorchEasyRec's Dual Augmented Two-Tower match (retrieval) model
(https://dlp-kdd.github.io/assets/pdf/DLP-KDD_2021_paper_4.pdf).

DSSM (``hashrec.models.dssm``) with an augment vector in each tower: the user tower is
an MLP over its DEEP group ``user_tower.input`` and its augment group
``user_tower.augment_input`` side by side (typically the user id alone, whose embedding
is the user's augment vector), then a linear layer to ``output_dim``, L2-normalized
under COSINE; the item tower likewise. Similarities over the temperature and the
softmax cross entropy are DSSM's (``MatchModel``).

In training the adaptive-mimic mechanism (AMM) adds two losses, as TorchEasyRec defines
them, over the batch's B rows (``hashrec.models.match.amm_rows``,
``hashrec.models.losses.amm_loss``):

* ``amm_loss_u`` = ``amm_u_weight`` x sum over rows and dimensions of
  (normalize(user augment) - item embedding of the row, detached)^2;
* ``amm_loss_i`` = ``amm_i_weight`` x the same of the item augment and the row's user
  embedding, detached.

Unweighted, each is a SUM over the rows, not a mean (TorchEasyRec's definition: it grows
with the batch size); with sample weights each is the weighted mean of the row sums.
The tower embeddings are detached there, so the AMM losses train the augment vectors
(their embedding tables) alone; the augment vectors also feed their tower's MLP, whose
softmax loss trains them too. An augment group is therefore as wide as the towers'
embeddings. Evaluation reports the softmax loss alone; export and predict give the
towers' embeddings and their similarity, as DSSM's.

The dense network returns, in train mode, one tensor of fixed shape: the similarities
and each row's two AMM terms side by side, (B, S + 2) (CUDA-graph friendly), which
``losses_from_logits`` and ``predictions`` read; in eval mode the similarities alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.models.group_encoders import input_count
from hashrec.models.losses import amm_loss, match_loss
from hashrec.models.match import (
    amm_rows,
    batch_similarity,
    hard_negative_input,
    split_hard_negatives,
)
from hashrec.models.match_model import MatchModel

# The AMM losses' keys, after the softmax loss's, in the order of the train-mode output's
# last two columns.
AMM_LOSSES = ("amm_loss_u", "amm_loss_i")


class DAT(MatchModel):
    """See the module docstring; arguments as ``RankModel``."""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dat
        user, item = config.user_tower, config.item_tower
        self.user_group = self._tower_group(user.input, "user_tower.input")
        self.user_augment_group = self._tower_group(user.augment_input,
                                                    "user_tower.augment_input")
        self.item_group = self._tower_group(item.input, "item_tower.input")
        self.item_augment_group = self._tower_group(item.augment_input,
                                                    "item_tower.augment_input")
        self._check_groups_read([self.user_group.name, self.user_augment_group.name,
                                 self.item_group.name, self.item_augment_group.name])
        self.user_tower = self._mlp_tower(
            user, "user_tower", self.user_group.dim + self.user_augment_group.dim)
        self.item_tower = self._mlp_tower(
            item, "item_tower", self.item_group.dim + self.item_augment_group.dim)
        self._check_widths(self.user_tower.dim, self.item_tower.dim)
        for tower, group in (("user_tower", self.user_augment_group),
                             ("item_tower", self.item_augment_group)):
            if group.dim != self.user_tower.dim:
                raise ModelError(
                    f"dat.{tower}.augment_input: the feature group {group.name!r} is "
                    f"{group.dim} wide, but the AMM loss compares it with the other "
                    f"tower's embeddings, {self.user_tower.dim} wide; give it features "
                    f"{self.user_tower.dim} wide in all (e.g. an id feature of that "
                    f"embedding_dim) or set output_dim to its width")
        self.amm_u_weight = _amm_weight(config.amm_u_weight, "amm_u_weight")
        self.amm_i_weight = _amm_weight(config.amm_i_weight, "amm_i_weight")
        # What evaluation reports (the softmax loss), and what training adds.
        self.eval_losses = self.losses
        self.losses = (*self.losses, *AMM_LOSSES)
        self._counts = [input_count(g, self.sequence_encoders) for g in self._input_groups()]

    def _input_groups(self) -> list:
        """The groups of ``dense_inputs``, in order."""
        return [self.user_group, self.user_augment_group, self.item_group,
                self.item_augment_group]

    def tower_groups(self, tower: str) -> list:
        """``tower``'s group, then its augment group (see ``MatchModel.tower_groups``)."""
        return [getattr(self, f"{tower}_group"), getattr(self, f"{tower}_augment_group")]

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The user group's and the user augment group's tensors over the batch's B rows,
        then the item group's and the item augment group's over its B + N rows (the
        sampled negatives' after the batch's items)."""
        rows = batch.batch_size
        user = self.group_inputs([self.user_group, self.user_augment_group], embedded, batch)
        item = self.group_inputs([self.item_group, self.item_augment_group], embedded, batch)
        return (*(t[:rows] for t in user), *item, *hard_negative_input(batch))

    def embeddings(self, *inputs: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``dense_inputs`` -> (user embeddings (B, D), item embeddings (B + N, D), user
        augment vectors (B, D), item augment vectors (B + N, D))."""
        groups, at = [], 0
        for group, count in zip(self._input_groups(), self._counts):
            groups += self.groups_from_inputs([group], inputs[at:at + count])
            at += count
        user, user_augment, item, item_augment = groups
        return (self.user_tower(torch.cat([user, user_augment], dim=-1)),
                self.item_tower(torch.cat([item, item_augment], dim=-1)),
                user_augment, item_augment)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature, (B, 1 + N) or in-batch
        (B, B + N); in train mode followed by each row's AMM terms of the user and the
        item augment vectors, (B, S + 2) float32."""
        inputs, hard = split_hard_negatives(inputs)
        user, item, user_augment, item_augment = self.embeddings(*inputs)
        similarity = batch_similarity(user, item, self.in_batch_negative,
                                      hard) / self.temperature
        if not self.training:
            return similarity
        rows = user.shape[0]
        terms = torch.stack([amm_rows(user_augment, item[:rows]),
                             amm_rows(item_augment[:rows], user)], dim=1)
        return torch.cat([similarity.float(), terms], dim=1)

    def _split(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The dense network's output -> (similarities, the AMM terms (B, 2), None in eval
        mode)."""
        if not self.training:
            return logits, None
        return logits[:, :-len(AMM_LOSSES)], logits[:, -len(AMM_LOSSES):]

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"similarity"}; in train mode also {"amm_terms": (B, 2)}, what ``loss`` reads
        besides."""
        similarity, terms = self._split(logits)
        out = {"similarity": similarity}
        if terms is not None:
            out["amm_terms"] = terms
        return out

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           *rest: torch.Tensor) -> dict[str, torch.Tensor]:
        """The softmax cross entropy (``MatchModel``); in train mode then ``amm_loss_u``
        and ``amm_loss_i`` (see the module docstring)."""
        similarity, terms = self._split(logits)
        task = self.tasks[0]
        weights = rest[0] if self.weighted else None
        out = {task.loss_names[0]: match_loss(similarity, task.match, weights,
                                              task.loss.label_smoothing)}
        if terms is not None:
            for k, (name, weight) in enumerate(zip(AMM_LOSSES, (self.amm_u_weight,
                                                                 self.amm_i_weight))):
                out[name] = amm_loss(terms[:, k], weight, weights)
        return out

    def loss(self, predictions: dict[str, torch.Tensor], batch,
             targets: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """The losses of ``forward``'s predictions: in eval mode the softmax loss, in
        train mode the AMM losses too (read from ``amm_terms``)."""
        logits = predictions["similarity"]
        if self.training:
            if "amm_terms" not in predictions:
                raise ModelError("dat's training losses read the AMM terms, which the "
                                 "train-mode forward gives as 'amm_terms'; pass its "
                                 "predictions, or switch to eval mode for the softmax loss")
            logits = torch.cat([logits, predictions["amm_terms"]], dim=1)
        return self.losses_from_logits(logits, *(targets or self.targets(batch)))


def _amm_weight(value: float, field: str) -> float:
    weight = proto_float(value)
    if not (math.isfinite(weight) and weight >= 0):
        raise ModelError(f"dat.{field}={weight}; allowed: a finite number >= 0 "
                         f"(default 0.5; 0 leaves the loss out of the gradient)")
    return weight

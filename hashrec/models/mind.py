"""MIND: TorchEasyRec's multi-interest match (retrieval) model
(Multi-Interest Network with Dynamic routing, https://arxiv.org/abs/1904.08030).

The user tower (``hashrec.models.match.MINDUserTower``) embeds a user as up to
``capsule_config.max_k`` interests: the user's DEEP group (``user_tower.input``) through
``user_mlp``, the behaviour sequence of the SEQUENCE group ``user_tower.history_input``
through ``hist_seq_mlp`` (optional) and the B2I capsule layer
(``hashrec.modules.capsule``), each interest beside the user's vector through
``concat_mlp`` and a linear layer to ``output_dim``. As in TorchEasyRec, ``user_mlp``'s
and ``hist_seq_mlp``'s last hidden unit is a linear layer without activation (the latter
without bias). The item tower is DSSM's (an MLP and a linear layer over its DEEP group).

In training and evaluation each row's interests are pooled by label-aware attention with
the row's item (``label_aware_attention``, power ``simi_pow``), then compared with the
items as in DSSM (``MatchModel``): similarities over the temperature, the row's item
against the negatives. At serving the user tower gives all interests (B, K, D), those
beyond a user's count zero, for a retrieval per interest.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import SEQUENCE, sequence_input
from hashrec.models.group_encoders import input_count
from hashrec.models.match import (
    MINDUserTower,
    batch_similarity,
    hard_negative_input,
    label_aware_attention,
    split_hard_negatives,
)
from hashrec.models.match_model import MatchModel
from hashrec.models.mlp_config import mlp_options
from hashrec.modules import MLP
from hashrec.modules.capsule import CapsuleLayer


class MIND(MatchModel):
    """See the module docstring; arguments as ``RankModel``."""

    # The behaviour sequence's group holds no query features.
    sequence_query = False

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.mind
        self.simi_pow = proto_float(config.simi_pow)
        if not math.isfinite(self.simi_pow):
            raise ModelError(f"mind.simi_pow={self.simi_pow}; allowed: a finite number "
                             f"(default 10)")
        tower = config.user_tower
        self.user_group = self._tower_group(tower.input, "user_tower.input")
        self.history_group = self._tower_group(tower.history_input,
                                               "user_tower.history_input", SEQUENCE)
        if self.history_group.query:
            raise ModelError(
                f"mind.user_tower.history_input: the SEQUENCE group "
                f"{self.history_group.name!r} holds non-sequence features "
                f"{[f.name for f in self.history_group.query]}, which MIND does not read; "
                f"move them to the user group {self.user_group.name!r}")
        self.item_group = self._tower_group(config.item_tower.input, "item_tower")
        self._check_groups_read([self.user_group.name, self.history_group.name,
                                 self.item_group.name])
        self.user_tower = self._user_tower(tower)
        self.item_tower = self._mlp_tower(config.item_tower, "item_tower", self.item_group.dim)
        self._check_widths(self.user_tower.dim, self.item_tower.dim)
        self._user_inputs = input_count(self.user_group, self.sequence_encoders)

    def _user_tower(self, tower) -> MINDUserTower:
        where = "mind.user_tower"
        user_mlp = _mlp_then_linear(tower.user_mlp, self.user_group.dim,
                                    f"{where}.user_mlp", bias=True)
        width = self.history_group.sequence_dim
        hist_mlp: nn.Module = nn.Identity()
        if tower.HasField("hist_seq_mlp") and len(tower.hist_seq_mlp.hidden_units):
            hist_mlp = _mlp_then_linear(tower.hist_seq_mlp, width, f"{where}.hist_seq_mlp",
                                        bias=False)
            width = tower.hist_seq_mlp.hidden_units[-1]
        caps = tower.capsule_config
        try:
            capsule = CapsuleLayer(width, caps.max_k, caps.max_seq_len, caps.high_dim,
                                   caps.num_iters, proto_float(caps.routing_logits_scale),
                                   proto_float(caps.routing_logits_stddev),
                                   proto_float(caps.squash_pow), caps.const_caps_num,
                                   caps.routing_init_method)
        except ValueError as err:
            raise ModelError(f"{where}.capsule_config.{err}") from err
        concat_mlp = MLP(tower.user_mlp.hidden_units[-1] + caps.high_dim,
                         mlp_options(tower.concat_mlp, f"{where}.concat_mlp"))
        width = concat_mlp.output_dim()
        output: nn.Module = nn.Identity()
        if self.output_dim > 0:
            output = nn.Linear(width, self.output_dim, bias=False)
            width = self.output_dim
        return MINDUserTower(user_mlp, hist_mlp, capsule, concat_mlp, output, self.cosine,
                             width)

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The user group's tensors and the behaviour sequence (B, L, Ds) and its lengths
        (B,) over the batch's B rows, then the item group's tensors over its B + N rows."""
        rows = batch.batch_size
        user = self.group_inputs([self.user_group], embedded, batch)
        _, sequence, lengths = sequence_input(self.history_group, embedded, batch)
        item = self.group_inputs([self.item_group], embedded, batch)
        return (*(t[:rows] for t in user), sequence[:rows], lengths[:rows], *item,
                *hard_negative_input(batch))

    def embeddings(self, *inputs: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``dense_inputs`` -> (interests (B, K, D), their mask (B, K), item embeddings
        (B + N, D))."""
        at = self._user_inputs
        (user,) = self.groups_from_inputs([self.user_group], inputs[:at])
        interests, mask = self.user_tower(user, inputs[at], inputs[at + 1])
        (item,) = self.groups_from_inputs([self.item_group], inputs[at + 2:])
        return interests, mask, self.item_tower(item)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature of each row's interests pooled
        by its item: (B, 1 + N), or in-batch (B, B + N)."""
        inputs, hard = split_hard_negatives(inputs)
        interests, mask, item = self.embeddings(*inputs)
        user = label_aware_attention(interests, mask, item[:interests.shape[0]],
                                     self.simi_pow)
        if self.cosine:
            user = nn.functional.normalize(user, p=2.0, dim=-1)
        return batch_similarity(user, item, self.in_batch_negative, hard) / self.temperature


def _mlp_then_linear(config, width: int, where: str, bias: bool) -> nn.Module:
    """TorchEasyRec's MIND user_mlp and hist_seq_mlp: an MLP of all but the last hidden
    unit, then a linear layer (``bias``) to the last, without activation."""
    options = mlp_options(config, where)
    last = options.hidden_units[-1]
    if len(options.hidden_units) == 1:
        return nn.Linear(width, last, bias=bias)
    ratios = options.dropout_ratio
    body = dataclasses.replace(options, hidden_units=options.hidden_units[:-1],
                               dropout_ratio=ratios if len(ratios) <= 1 else ratios[:-1])
    mlp = MLP(width, body)
    return nn.Sequential(mlp, nn.Linear(mlp.output_dim(), last, bias=bias))

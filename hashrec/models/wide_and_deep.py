"""WideAndDeep: a wide logit from WIDE feature groups plus a deep MLP over DEEP groups.

Wide part: every feature of the WIDE groups is embedded in a wide table
``<table>_wide`` of ``wide_embedding_dim`` columns (4 by default), separate from the
table ``<table>`` that a DEEP group's copy of the feature reads, as TorchEasyRec
does; a feature in a WIDE and a DEEP group thus has two tables that train apart,
and one only in WIDE groups is looked up in its wide table alone
(``hashrec.features.wide``). The sum of the wide embeddings over the features and
the columns is the wide logit (B, 1).

Deep part: the DEEP groups' features, concatenated in group order (B, D), through the
``deep`` MLP.

Without ``final`` the logit is the wide logit plus a linear layer over the deep MLP's
output; with ``final`` the wide logit and the deep output, concatenated, go through
the final MLP and then the linear layer. The prediction is the logit's sigmoid.
Every group must be WIDE or DEEP, and there must be one of each at least.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, WIDE, GroupSpec
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.modules import MLP, FactorizationMachine


class WideDeepNet(nn.Module):
    """The dense network of WideAndDeep and DeepFM, shared by the eager model and its
    scripted export.

    ``forward([wide (B, W), deep (B, D)] or [wide, deep, fm (B, N * d)]) -> logits
    (B,)``: the wide logit is ``wide`` summed over its columns. With ``fm_features``
    N > 0 the factorization machine reads ``fm`` (``deep`` where there is no ``fm``)
    as N features of d columns, giving (B, d). With a final MLP the logit is
    output(final([wide logit, fm output, deep MLP output])); without, wide logit + fm
    output summed over its columns + output(deep MLP output).

    Args:
        deep: the deep MLP.
        final: the final MLP, or None.
        output: the linear layer to the logit (``num_class`` logits with classes, to
            each of which the wide logit is added, as in TorchEasyRec).
        fm_features: N; 0 for no factorization machine (WideAndDeep).
    """

    def __init__(self, deep: nn.Module, final: nn.Module | None, output: nn.Module,
                 fm_features: int = 0) -> None:
        super().__init__()
        self.deep = deep
        self.has_final = final is not None
        self.final = final if final is not None else nn.Identity()
        self.output = output
        self.fm_features = fm_features
        self.fm = FactorizationMachine()

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        wide, deep = inputs[0], inputs[1]
        parts = [wide.sum(dim=-1, keepdim=True)]
        if self.fm_features > 0:
            flat = inputs[2] if len(inputs) > 2 else deep
            parts.append(self.fm(flat.reshape(flat.shape[0], self.fm_features, -1)))
        hidden = self.deep(deep)
        if self.has_final:
            return self.output(self.final(torch.cat(parts + [hidden], dim=-1))).squeeze(-1)
        logits = self.output(hidden)
        for part in parts:
            logits = logits + part.sum(dim=-1, keepdim=True)
        return logits.squeeze(-1)


def merged_group(name: str, group_type: str, groups: list[GroupSpec]) -> GroupSpec:
    """The groups' features in one group: its input is theirs concatenated in order."""
    return GroupSpec(name, group_type, features=tuple(f for g in groups for f in g.features))


class WideAndDeep(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    The dense network's inputs (``input_groups``) are the wide group, the deep group
    and, where there is one, the fm group.

    Attributes:
        wide_group: the WIDE groups' features as one group (the wide input).
        deep_group: the DEEP groups' features as one group (the deep MLP's input).
        fm_group: DeepFM's DEEP group ``fm``, the factorization machine's own input;
            None without one (and always for WideAndDeep).
        net: the dense network (``WideDeepNet``).
    """

    kind = "wide_and_deep"
    # The DEEP group that feeds the factorization machine instead of the deep MLP (DeepFM).
    fm_group_name = ""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = getattr(model_config, self.kind)
        wide, deep = self._split_groups()
        self.wide_group = merged_group("wide", WIDE, wide)
        self.deep_group = merged_group("deep", DEEP, deep)
        self.fm_group = self.groups[self.fm_group_name] if self._has_fm_group() else None
        self.input_groups = [self.wide_group, self.deep_group] + (
            [self.fm_group] if self.fm_group is not None else [])
        deep_mlp = MLP(self.deep_group.dim, mlp_options(config.deep, f"{self.kind}.deep"))
        fm_features, fm_dim = self._fm_layout()
        final, width = optional_mlp(config, "final", 1 + fm_dim + deep_mlp.output_dim(),
                                    f"{self.kind}.final")
        output = nn.Linear(width if final is not None else deep_mlp.output_dim(),
                           self.num_class)
        self.net = WideDeepNet(deep_mlp, final, output, fm_features)

    def _has_fm_group(self) -> bool:
        group = self.groups.get(self.fm_group_name)
        return group is not None and group.group_type == DEEP

    def _fm_layout(self) -> tuple[int, int]:
        """(features N, columns d) of the factorization machine; (0, 0): none."""
        return 0, 0

    def _split_groups(self) -> tuple[list[GroupSpec], list[GroupSpec]]:
        """(the WIDE groups, the DEEP groups of the deep MLP), in config order."""
        return split_wide_deep(self.groups, self.kind, skip=self.fm_group_name)


def split_wide_deep(groups: dict[str, GroupSpec], kind: str, skip: str = "",
                    wide_part: str = "the wide logit"
                    ) -> tuple[list[GroupSpec], list[GroupSpec]]:
    """(the WIDE groups, the DEEP groups but ``skip``) of a model ``kind`` that reads
    WIDE groups (``wide_part``, in messages) and DEEP groups (the deep MLP's input), in
    config order.

    Raises:
        ModelError: a group of another type, or no WIDE or no DEEP group.
    """
    wide, deep = [], []
    for name, group in groups.items():
        if group.group_type == WIDE:
            wide.append(group)
        elif group.group_type == DEEP:
            if name != skip:
                deep.append(group)
        else:
            raise ModelError(
                f"{kind}: feature group {name!r} is {group.group_type}; {kind} reads WIDE "
                f"groups ({wide_part}) and DEEP groups (the deep MLP)")
    for found, group_type, part in ((wide, WIDE, wide_part),
                                    (deep, DEEP, "the deep MLP's input")):
        if not found:
            raise ModelError(f"{kind} needs a {group_type} feature group ({part}); "
                             f"model_config.feature_groups has none")
    return wide, deep

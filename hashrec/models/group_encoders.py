"""The sequence encoders of DEEP feature groups, and how a group's input reaches them.

A DEEP group with ``sequence_encoders`` (``hashrec.config.sequence_groups``) outputs its
features, then each encoder's output (B, its dim), in encoder order, as TorchEasyRec
concatenates them; a model reads the whole (B, group dim) as it reads any DEEP group.
The encoders are dense layers, so they run inside the dense network (and its CUDA
graph): ``dense_inputs`` hands over a group's plain features concatenated and, for its
sequence groups, the (query, sequence, lengths) tensors of fixed shapes
(``group_inputs``); ``dense_from_inputs`` runs the encoders on them and concatenates the
group (``group_from_inputs``). A group without encoders is one tensor, as before.

A group merged from several (the input of the multi-task models, WideAndDeep's deep
part) keeps each source group's encoder outputs after that group's features.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import FeatureInfo, GroupSpec, deep_input, sequence_input
from hashrec.models.mlp_config import mlp_options
from hashrec.modules import DINAttention, MultiWindowDIN, SequencePooling, SimpleAttention


class GroupEncoders(nn.Module):
    """A DEEP group's sequence encoders: the flat list of its sequence groups' tensors
    (each group's query where it has query features, then its sequence (B, L, Ds) and
    lengths (B,)) -> the encoders' outputs concatenated, (B, sum of their dims)."""

    def __init__(self, group: GroupSpec) -> None:
        super().__init__()
        offsets, at = [], 0
        for sequence_group in group.sequence_groups:
            has_query = bool(sequence_group.query)
            offsets.append((at if has_query else -1, at + has_query))
            at += 2 + has_query
        self.inputs = at
        self.encoders = nn.ModuleList([_encoder(spec, group.sequence_groups[spec.input])
                                       for spec in group.encoders])
        self.query_at = [offsets[spec.input][0] for spec in group.encoders]
        self.sequence_at = [offsets[spec.input][1] for spec in group.encoders]

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for i, encoder in enumerate(self.encoders):
            sequence = inputs[self.sequence_at[i]]
            # a group without query features feeds pooling alone, which reads no query
            query = inputs[self.query_at[i]] if self.query_at[i] >= 0 else sequence
            outputs.append(encoder(query, sequence, inputs[self.sequence_at[i] + 1]))
        return torch.cat(outputs, dim=-1)


def _encoder(spec, sequence_group: GroupSpec) -> nn.Module:
    """The module of one encoder spec over ``sequence_group``'s tensors."""
    options = spec.options
    query_dim, sequence_dim = sequence_group.query_dim, sequence_group.sequence_dim
    try:
        if spec.kind == "din_encoder":
            return DINAttention(query_dim, sequence_dim,
                                mlp_options(options.attn_mlp, spec.where + ".attn_mlp"))
        if spec.kind == "simple_attention":
            return SimpleAttention(query_dim, sequence_dim)
        if spec.kind == "pooling_encoder":
            return SequencePooling(sequence_dim, options.pooling_type)
        if spec.kind == "multi_window_din_encoder":
            return MultiWindowDIN(query_dim, sequence_dim, tuple(options.windows_len),
                                  mlp_options(options.attn_mlp, spec.where + ".attn_mlp"))
    except ValueError as err:
        raise ModelError(f"{spec.where}: {err}") from err
    raise ModelError(f"{spec.where}: encoder kind {spec.kind!r} is not supported")


def build_group_encoders(groups: Mapping[str, GroupSpec]) -> nn.ModuleDict:
    """The encoders of every group that has some, by group name."""
    return nn.ModuleDict({name: GroupEncoders(group) for name, group in groups.items()
                          if group.encoders})


@functools.lru_cache(maxsize=256)
def segments(group: GroupSpec) -> tuple[tuple[str, tuple[FeatureInfo, ...]], ...]:
    """``group``'s features as runs: (``""``, plain features) or (source group, the
    outputs of that group's encoders), in the group's order."""
    runs: list[tuple[str, list[FeatureInfo]]] = []
    for info in group.features:
        if runs and runs[-1][0] == info.source:
            runs[-1][1].append(info)
        else:
            runs.append((info.source, [info]))
    return tuple((source, tuple(infos)) for source, infos in runs)


def group_inputs(group: GroupSpec, groups: Mapping[str, GroupSpec], embedded,
                 batch) -> list[torch.Tensor]:
    """The tensors of DEEP (or WIDE) ``group`` that ``group_from_inputs`` reads: a plain
    run of features concatenated (B, width); an encoded run, its source group's sequence
    groups' (query, sequence, lengths) (no query where a group has no query features).
    ``groups``: the model's groups by name (the sources)."""
    tensors: list[torch.Tensor] = []
    for source, infos in segments(group):
        if not source:
            tensors.append(deep_input(GroupSpec(group.name, group.group_type, infos),
                                      embedded, batch))
            continue
        for sequence_group in groups[source].sequence_groups:
            query, sequence, lengths = sequence_input(sequence_group, embedded, batch)
            tensors += ([query] if query is not None else []) + [sequence, lengths]
    return tensors


def input_count(group: GroupSpec, encoders: nn.ModuleDict) -> int:
    """How many tensors ``group_inputs`` gives for ``group``."""
    return sum(encoders[source].inputs if source else 1 for source, _ in segments(group))


def group_from_inputs(group: GroupSpec, inputs: Sequence[torch.Tensor],
                      encoders: nn.ModuleDict) -> torch.Tensor:
    """(B, group.dim) of ``group_inputs``' tensors: the plain runs as given, each encoded
    run through its source group's encoders."""
    parts, at = [], 0
    for source, _ in segments(group):
        if not source:
            parts.append(inputs[at])
            at += 1
            continue
        module = encoders[source]
        parts.append(module(list(inputs[at:at + module.inputs])))
        at += module.inputs
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

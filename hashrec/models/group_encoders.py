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
from hashrec.modules import (
    DINAttention,
    HSTUEncoder,
    MultiWindowDIN,
    SequencePooling,
    SimpleAttention,
)


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
            # a group without query features feeds encoders that read no query (pooling,
            # HSTU)
            query = inputs[self.query_at[i]] if self.query_at[i] >= 0 else sequence
            outputs.append(encoder(query, sequence, inputs[self.sequence_at[i] + 1]))
        return torch.cat(outputs, dim=-1)


def _encoder(spec, sequence_group: GroupSpec) -> nn.Module:
    """The module of one encoder spec over ``sequence_group``'s tensors."""
    options = spec.options
    query_dim, sequence_dim = sequence_group.query_dim, sequence_group.sequence_dim
    if spec.kind == "hstu_encoder":
        _check_hstu(spec, sequence_group)
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
        if spec.kind == "hstu_encoder":
            return HSTUEncoder(sequence_dim, options.attn_dim, options.linear_dim,
                               options.max_seq_length, num_heads=options.num_heads,
                               num_blocks=options.num_blocks,
                               max_output_len=options.max_output_len,
                               pos_dropout_rate=options.pos_dropout_rate,
                               linear_dropout_rate=options.linear_dropout_rate,
                               linear_activation=options.linear_activation)
    except ValueError as err:
        raise ModelError(f"{spec.where}: {err}") from err
    raise ModelError(f"{spec.where}: encoder kind {spec.kind!r} is not supported")


def _check_hstu(spec, sequence_group: GroupSpec) -> None:
    """An ``hstu_encoder`` over ``sequence_group``: the group is as wide as the
    ``sequence_dim`` given (where one is), its sequences fit the position table."""
    options, width = spec.options, sequence_group.sequence_dim
    if options.HasField("sequence_dim") and options.sequence_dim != width:
        raise ModelError(f"{spec.where}.sequence_dim is {options.sequence_dim}; the sequence "
                         f"group {sequence_group.name!r} is {width} wide (its sequence "
                         f"features' dims summed): set {width} or leave it out")
    positions = options.max_seq_length + options.max_output_len + 1
    if sequence_group.sequence_length > positions:
        raise ModelError(
            f"{spec.where}.max_seq_length is {options.max_seq_length}: with max_output_len "
            f"{options.max_output_len} the position table holds {positions} positions, and "
            f"the sequence group {sequence_group.name!r} holds {sequence_group.sequence_length}"
            f" (its features' sequence_length); set max_seq_length to "
            f"{sequence_group.sequence_length - options.max_output_len - 1} or more")


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

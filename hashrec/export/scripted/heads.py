"""Scriptable dense networks: feature-group assembly and the models' towers.

The towers are the trained model's own modules (MLP, DINAttention, Linear, and
the dense networks of the models that have one, such as ``WideDeepNet``); only
the glue that assembles feature groups from the embedding outputs and the dense
inputs is written here in TorchScript's typed subset, following
``hashrec.models.feature_groups``: a DEEP (or WIDE) group concatenates its
features in order (a group's sequence encoders' outputs after its features, through the
model's encoders); a SEQUENCE group concatenates its query features, pads and
concatenates its sequence features and takes, per row, the largest length of
its id sequences.

Every tower module takes the same five dictionaries (pooled, sequences,
sequence lengths, dense, sequence dense) so that towers of different kinds
iterate in one ``ModuleList``.
"""

import torch
from torch import nn

from hashrec.export.errors import ExportError
from hashrec.models import (
    DBMTL,
    DC2VR,
    DCNV1,
    DCNV2,
    DLRM,
    PLE,
    TDM,
    DeepFM,
    MaskNet,
    MMoE,
    MultiTaskBackbone,
    MultiTower,
    MultiTowerDIN,
    PEPNet,
    RankBackbone,
    RocketLaunching,
    SimpleMultiTask,
    WideAndDeep,
    WuKong,
    XDeepFM,
)
from hashrec.models.feature_groups import GroupSpec
from hashrec.models.group_encoders import segments
from hashrec.models.group_net import GroupNetModel

Tensors = dict[str, torch.Tensor]


def _pick(name: str, embedded: bool, pooled: Tensors, dense: Tensors) -> torch.Tensor:
    if embedded:
        return pooled[name]
    return dense[name]


class PlainFeatures(nn.Module):
    """A run of a DEEP group's features: (B, sum of their widths)."""

    names: list[str]
    embedded: list[bool]

    def __init__(self, features) -> None:
        super().__init__()
        self.names = [f.name for f in features]
        self.embedded = [f.embedded for f in features]

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        parts = [_pick(name, self.embedded[i], pooled, dense)
                 for i, name in enumerate(self.names)]
        return torch.cat(parts, dim=-1)


class EncodedFeatures(nn.Module):
    """A DEEP group's sequence encoders' outputs: its sequence groups' tensors through the
    model's ``GroupEncoders`` (``hashrec.models.group_encoders``)."""

    def __init__(self, source: GroupSpec, encoders: nn.Module) -> None:
        super().__init__()
        self.sequence_groups = nn.ModuleList([SequenceGroup(g) for g in source.sequence_groups])
        self.encoders = encoders

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        inputs: list[torch.Tensor] = []
        for group in self.sequence_groups:
            query, sequence, lengths = group(pooled, sequences, sequence_lengths, dense,
                                             sequence_dense)
            if group.has_query:
                inputs.append(query)
            inputs.append(sequence)
            inputs.append(lengths)
        return self.encoders(inputs)


class DeepGroup(nn.Module):
    """A DEEP group: (B, sum of feature widths), its sequence encoders' outputs among
    them."""

    def __init__(self, group: GroupSpec, model: nn.Module) -> None:
        super().__init__()
        parts: list[nn.Module] = []
        for source, infos in segments(group):
            if source:
                parts.append(EncodedFeatures(model.groups[source],
                                             model.sequence_encoders[source]))
            else:
                parts.append(PlainFeatures(infos))
        self.parts = nn.ModuleList(parts)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for part in self.parts:
            outputs.append(part(pooled, sequences, sequence_lengths, dense, sequence_dense))
        return torch.cat(outputs, dim=-1)


class SequenceGroup(nn.Module):
    """A SEQUENCE group: (query (B, Dq), sequence (B, L, Ds), lengths (B,)); a sequence
    group without query features (``has_query`` false) gives an empty query."""

    query_names: list[str]
    query_embedded: list[bool]
    sequence_names: list[str]
    sequence_embedded: list[bool]
    has_query: bool

    def __init__(self, group: GroupSpec) -> None:
        super().__init__()
        self.query_names = [f.name for f in group.query]
        self.query_embedded = [f.embedded for f in group.query]
        self.sequence_names = [f.name for f in group.sequence]
        self.sequence_embedded = [f.embedded for f in group.sequence]
        self.has_query = bool(group.query)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query = torch.empty(0)
        if self.has_query:
            query = torch.cat([_pick(name, self.query_embedded[i], pooled, dense)
                               for i, name in enumerate(self.query_names)], dim=-1)
        parts: list[torch.Tensor] = []
        lengths = torch.empty(0)
        found = False
        for i, name in enumerate(self.sequence_names):
            if self.sequence_embedded[i]:
                parts.append(sequences[name])
                feature_lengths = sequence_lengths[name]
                lengths = torch.maximum(lengths, feature_lengths) if found \
                    else feature_lengths
                found = True
            else:
                parts.append(sequence_dense[name])
        max_length = 0
        for part in parts:
            max_length = max(max_length, part.shape[1])
        padded = [nn.functional.pad(p, [0, 0, 0, max_length - p.shape[1]]) for p in parts]
        return query, torch.cat(padded, dim=-1), lengths.clamp(max=max_length)


class MLPTower(nn.Module):
    """A DEEP group through an MLP."""

    def __init__(self, group: GroupSpec, mlp: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.group = DeepGroup(group, model)
        self.mlp = mlp

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        return self.mlp(self.group(pooled, sequences, sequence_lengths, dense,
                                   sequence_dense))


class DINTower(nn.Module):
    """A SEQUENCE group through DIN target attention."""

    def __init__(self, group: GroupSpec, attention: nn.Module) -> None:
        super().__init__()
        self.group = SequenceGroup(group)
        self.attention = attention

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        query, sequence, lengths = self.group(pooled, sequences, sequence_lengths, dense,
                                              sequence_dense)
        return self.attention(query, sequence, lengths)


class TowersHead(nn.Module):
    """Towers' outputs concatenated -> final MLP (or identity) -> linear -> logits (B,), or
    (B, num_class)."""

    def __init__(self, towers: list[nn.Module], final: nn.Module | None,
                 output: nn.Module) -> None:
        super().__init__()
        self.towers = nn.ModuleList(towers)
        self.final = final if final is not None else nn.Identity()
        self.output = output

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for tower in self.towers:
            outputs.append(tower(pooled, sequences, sequence_lengths, dense, sequence_dense))
        hidden = self.final(torch.cat(outputs, dim=-1))
        return self.output(hidden).squeeze(-1)


def multi_tower_head(model: MultiTower) -> TowersHead:
    """MultiTower's and MultiTowerDIN's dense network (MLP towers, then DIN towers, as the
    model orders them)."""
    towers: list[nn.Module] = [MLPTower(model.groups[name], mlp, model)
                               for name, mlp in model.towers.items()]
    if isinstance(model, MultiTowerDIN):
        towers += [DINTower(model.groups[name], attention)
                   for name, attention in model.din_towers.items()]
    return TowersHead(towers, model.final, model.output)


class GroupsHead(nn.Module):
    """Feature groups, each concatenated into one input, through a model's dense network
    that takes the list of them (``GroupNetModel.net``: ``WideDeepNet``, ``DLRMNet``)."""

    def __init__(self, groups: list[GroupSpec], net: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.groups = nn.ModuleList([DeepGroup(group, model) for group in groups])
        self.net = net

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        inputs: list[torch.Tensor] = []
        for group in self.groups:
            inputs.append(group(pooled, sequences, sequence_lengths, dense, sequence_dense))
        return self.net(inputs)


def groups_head(model: GroupNetModel) -> GroupsHead:
    """The dense network of the models that read whole feature groups
    (``GroupNetModel``: WideAndDeep, DeepFM, DLRM, DCN v1 and v2, MaskNet, xDeepFM,
    WuKong, RocketLaunching (its light network), SimpleMultiTask, MMoE, DBMTL, DC2VR,
    PLE, PEPNet)."""
    return GroupsHead(model.input_groups, model.net, model)


class DeepGroupTensors(nn.Module):
    """A DEEP or WIDE group as a list of its one tensor (B, D)."""

    def __init__(self, group: GroupSpec, model: nn.Module) -> None:
        super().__init__()
        self.group = DeepGroup(group, model)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> list[torch.Tensor]:
        return [self.group(pooled, sequences, sequence_lengths, dense, sequence_dense)]


class SequenceGroupTensors(nn.Module):
    """A SEQUENCE group as the list [query, sequence, lengths]."""

    def __init__(self, group: GroupSpec) -> None:
        super().__init__()
        self.group = SequenceGroup(group)

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> list[torch.Tensor]:
        query, sequence, lengths = self.group(pooled, sequences, sequence_lengths, dense,
                                              sequence_dense)
        return [query, sequence, lengths]


class BackboneHead(nn.Module):
    """The groups a backbone reads, as its flat list of inputs, through its network."""

    def __init__(self, groups: list[GroupSpec], net: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.groups = nn.ModuleList([SequenceGroupTensors(group)
                                     if group.group_type == "SEQUENCE"
                                     else DeepGroupTensors(group, model) for group in groups])
        self.net = net

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        inputs: list[torch.Tensor] = []
        for group in self.groups:
            inputs.extend(group(pooled, sequences, sequence_lengths, dense, sequence_dense))
        return self.net(inputs)


def backbone_head(model: RankBackbone) -> BackboneHead:
    """The dense network of RankBackbone and MultiTaskBackbone."""
    return BackboneHead(model.input_groups, model.net, model)


class TDMHead(nn.Module):
    """TDM's dense network: the SEQUENCE group through the multi-window DIN, the other
    (DEEP) groups after it, the final MLP, the linear layer -> logits (B,), or
    (B, num_class)."""

    def __init__(self, model: TDM) -> None:
        super().__init__()
        self.sequence = SequenceGroup(model.groups[model.sequence_group])
        self.multiwindow_din = model.multiwindow_din
        self.others = nn.ModuleList([DeepGroup(model.groups[name], model)
                                     for name in model.other_groups])
        self.final = model.final
        self.output = model.output

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        query, sequence, lengths = self.sequence(pooled, sequences, sequence_lengths, dense,
                                                 sequence_dense)
        first = self.multiwindow_din(query, sequence, lengths)
        parts: list[torch.Tensor] = [first]
        for group in self.others:
            parts.append(group(pooled, sequences, sequence_lengths, dense,
                               sequence_dense).to(first.dtype))
        return self.output(self.final(torch.cat(parts, dim=-1))).squeeze(-1)


HEADS = {MultiTower: multi_tower_head, MultiTowerDIN: multi_tower_head,
         WideAndDeep: groups_head, DeepFM: groups_head, DLRM: groups_head, MMoE: groups_head,
         DBMTL: groups_head, DC2VR: groups_head, PLE: groups_head, DCNV1: groups_head,
         DCNV2: groups_head, MaskNet: groups_head, XDeepFM: groups_head, SimpleMultiTask: groups_head,
         WuKong: groups_head, PEPNet: groups_head, RocketLaunching: groups_head,
         RankBackbone: backbone_head, MultiTaskBackbone: backbone_head, TDM: TDMHead}


def dense_head(model: nn.Module) -> nn.Module:
    """The scriptable dense network of ``model``.

    Raises:
        ExportError: the model kind has no scripted export yet.
    """
    for kind, build in HEADS.items():
        if type(model) is kind:
            return build(model)
    raise ExportError(f"scripted export of {type(model).__name__} is not implemented; "
                      f"supported: {', '.join(k.__name__ for k in HEADS)}")

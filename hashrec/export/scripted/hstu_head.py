"""The scripted dense network of an HSTU match model (``hashrec.models.hstu_match``): its
user tower over the history, the contextual features and the history's actions, watch
times and timestamps; its item tower over the candidate group (a sequence group's first
item a row: a row of an item table holds one); both, with the pair's similarity over
the temperature, for the whole model (``match_outputs`` splits it as DSSM's)."""

import torch
from torch import nn

from hashrec.export.scripted.heads import DeepGroup, SequenceGroup, Tensors
from hashrec.models.hstu_match import AUX_GROUPS


class SequenceValues(nn.Module):
    """One value group's (B, length) values: its one raw sequence's first value a position,
    padded or cut to ``length``; zeros without the group."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group = SequenceGroup(group) if group is not None else None

    def forward(self, rows: int, length: int, like: torch.Tensor, pooled: Tensors,
                sequences: Tensors, sequence_lengths: Tensors, dense: Tensors,
                sequence_dense: Tensors) -> torch.Tensor:
        out = torch.zeros(rows, length, dtype=like.dtype, device=like.device)
        # a None submodule's branch is left out when TorchScript compiles the module
        if self.group is not None:
            _, values, _ = self.group(pooled, sequences, sequence_lengths, dense,
                                      sequence_dense)
            values = values[:, :length, 0]
            out = nn.functional.pad(values, [0, length - values.shape[1]])
        return out


class HSTUUserHead(nn.Module):
    """The user tower over its groups -> (B, D) users."""

    def __init__(self, model) -> None:
        super().__init__()
        self.history = SequenceGroup(model.user_group)
        self.contextual = DeepGroup(model.contextual_group, model) \
            if model.contextual_group is not None else None
        self.values = nn.ModuleList([SequenceValues(model.aux_groups.get(name))
                                     for name in AUX_GROUPS])
        self.tower = model.user_tower

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        _, history, lengths = self.history(pooled, sequences, sequence_lengths, dense,
                                           sequence_dense)
        contextual = history.new_zeros(history.shape[0], 0)
        if self.contextual is not None:
            contextual = self.contextual(pooled, sequences, sequence_lengths, dense,
                                         sequence_dense)
        values: list[torch.Tensor] = []
        for part in self.values:
            values.append(part(history.shape[0], history.shape[1], history, pooled, sequences,
                               sequence_lengths, dense, sequence_dense))
        return self.tower(history, lengths, contextual, values[0], values[1], values[2])


class HSTUItemHead(nn.Module):
    """The item tower over the candidate group -> (B, D) items: a DEEP group's row, or a
    sequence group's first item."""

    def __init__(self, model) -> None:
        super().__init__()
        deep = model.item_group.group_type == "DEEP"
        self.deep_group = DeepGroup(model.item_group, model) if deep else None
        self.sequence_group = None if deep else SequenceGroup(model.item_group)
        self.tower = model.item_tower

    def forward(self, pooled: Tensors, sequences: Tensors, sequence_lengths: Tensors,
                dense: Tensors, sequence_dense: Tensors) -> torch.Tensor:
        items = torch.empty(0)
        # one of the two is None: its branch is left out when TorchScript compiles this
        if self.deep_group is not None:
            items = self.deep_group(pooled, sequences, sequence_lengths, dense, sequence_dense)
        if self.sequence_group is not None:
            _, sequence, _ = self.sequence_group(pooled, sequences, sequence_lengths, dense,
                                                 sequence_dense)
            items = sequence[:, 0]
        return self.tower(items)


def hstu_head(model, tower: str) -> nn.Module:
    """The HSTU match model's network, or its ``tower`` ("user", "item") alone."""
    if tower == "user":
        return HSTUUserHead(model)
    if tower == "item":
        return HSTUItemHead(model)
    from hashrec.export.scripted.match_head import MatchHead  # it dispatches to this module
    return MatchHead(model, HSTUUserHead(model), HSTUItemHead(model))

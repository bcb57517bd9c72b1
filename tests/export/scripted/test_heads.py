"""Scripted feature-group assembly equals the model's own (hashrec.models.feature_groups)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hashrec.export.scripted.heads import SequenceGroup
from hashrec.models.feature_groups import SEQUENCE, FeatureInfo, GroupSpec, sequence_input


def test_scripted_sequence_group_takes_the_longest_sequence_per_row():
    group = GroupSpec("seq", SEQUENCE, query=(FeatureInfo("user", 3, False, False),),
                      sequence=(FeatureInfo("click", 3, True, True, "click"),
                                FeatureInfo("buy", 3, True, True, "buy"),
                                FeatureInfo("price", 1, False, True, "click")))
    gen = torch.Generator().manual_seed(0)
    pooled: dict[str, torch.Tensor] = {}
    dense = {"user": torch.randn(3, 3, generator=gen)}
    sequences = {"click": torch.randn(3, 2, 3, generator=gen),
                 "buy": torch.randn(3, 4, 3, generator=gen)}
    lengths = {"click": torch.tensor([2, 0, 2]), "buy": torch.tensor([1, 4, 0])}
    sequence_dense = {"price": torch.randn(3, 2, 1, generator=gen)}
    scripted = torch.jit.script(SequenceGroup(group))
    got = scripted(pooled, sequences, lengths, dense, sequence_dense)
    embedded = SimpleNamespace(pooled=pooled,
                               sequences={n: (sequences[n], lengths[n]) for n in sequences})
    batch = SimpleNamespace(dense=dense, sequence_dense=sequence_dense)
    expected = sequence_input(group, embedded, batch)
    assert got[2].tolist() == [2, 4, 2]
    for got_part, expected_part in zip(got, expected):
        assert torch.equal(got_part, expected_part)

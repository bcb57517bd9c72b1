"""feature_ids: sequence truncation with and without a host-known longest bag."""

import dataclasses

import pytest
import torch

from hashrec.embedding import EmbeddingFeatureSpec, KeyedJaggedTensor
from hashrec.embedding.batching import feature_ids


def _bags(lengths):
    values = torch.arange(100, 100 + sum(lengths))
    return KeyedJaggedTensor.from_lengths(["s"], values, torch.tensor(lengths))["s"]


@pytest.mark.parametrize("max_length", [2, 3, 5], ids=["truncates", "exact", "longer"])
def test_sequence_ids_same_with_or_without_known_longest_bag(max_length):
    spec = EmbeddingFeatureSpec("s", "t", is_sequence=True, max_length=max_length)
    bags = _bags([3, 0, 1, 2])
    assert bags.max_bag == 3
    known = feature_ids(spec, bags)
    unknown = feature_ids(spec, dataclasses.replace(bags, max_bag=None))
    for a, b in ((known.values, unknown.values), (known.lengths, unknown.lengths),
                 (known.offsets, unknown.offsets)):
        assert a.tolist() == b.tolist()
    expected = [v for bag in ([100, 101, 102], [], [103], [104, 105]) for v in bag[:max_length]]
    assert known.values.tolist() == expected

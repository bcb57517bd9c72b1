"""unique_pairs against a row-wise torch.unique of (key, tag) pairs."""

from __future__ import annotations

import pytest
import torch

from hashrec.table.unique import unique_pairs

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


@pytest.mark.parametrize("tag_kind", ["none", "all_equal", "mixed"])
def test_unique_pairs_match_row_wise_unique(tag_kind):
    gen = torch.Generator().manual_seed(3)
    keys = torch.randint(-5, 5, (300,), generator=gen)
    keys[:4] = torch.tensor([INT64_MIN, INT64_MAX, INT64_MIN, INT64_MAX])
    tags = {"none": None, "all_equal": torch.full((300,), 7, dtype=torch.int32),
            "mixed": torch.randint(0, 3, (300,), generator=gen, dtype=torch.int32)}[tag_kind]
    unique, utags, inverse, counts = unique_pairs(keys, tags)
    pairs = torch.stack([keys, torch.zeros_like(keys) if tags is None else tags.long()], 1)
    want, want_inverse, want_counts = torch.unique(pairs, dim=0, return_inverse=True,
                                                   return_counts=True)
    assert torch.equal(unique, want[:, 0])
    assert (utags is None) == (tags is None)
    if utags is not None:
        assert utags.dtype == torch.int32 and torch.equal(utags.long(), want[:, 1])
    assert torch.equal(inverse, want_inverse) and torch.equal(counts, want_counts)


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_unique_pairs_of_nothing(tagged):
    keys = torch.empty(0, dtype=torch.int64)
    tags = torch.empty(0, dtype=torch.int32) if tagged else None
    unique, utags, inverse, counts = unique_pairs(keys, tags)
    assert unique.numel() == inverse.numel() == counts.numel() == 0
    assert (utags is None) != tagged and inverse.dtype == counts.dtype == torch.int64

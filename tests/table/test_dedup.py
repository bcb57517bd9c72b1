"""``ops.dedup.unique_pairs_fixed`` (interpreted on CPU without CUDA) against
``unique_pairs``: the same pairs, inverse and counts in batch-sized outputs."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table.ops.dedup import unique_pairs_fixed  # noqa: E402
from hashrec.table.unique import unique_pairs  # noqa: E402

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 7, 2500])
@pytest.mark.parametrize("tag_kind", ["none", "mixed"])
def test_fixed_unique_pairs_hold_the_unique_pairs_ahead_of_padding(tag_kind, n):
    """The exact outcome's pairs, inverse and counts in the first ``count`` places of
    batch-sized outputs (padding after: zeros), and each pair's last batch position;
    spans several programs at 2500 keys."""
    gen = torch.Generator().manual_seed(5)
    keys = torch.randint(-6, 6, (n,), generator=gen)
    keys[:3] = torch.tensor([INT64_MIN, INT64_MAX, INT64_MIN])[:n]
    tags = None if tag_kind == "none" else torch.randint(0, 3, (n,), generator=gen,
                                                          dtype=torch.int32)
    unique, utags, inverse, counts = unique_pairs(keys, tags)
    got = unique_pairs_fixed(keys.to(DEVICE), None if tags is None else tags.to(DEVICE))
    got = type(got)(*(None if t is None else t.cpu() for t in got))
    u = int(got.count)
    assert got.count.shape == (1,) and u == unique.numel()
    assert all(t.shape == keys.shape for t in (got.keys, got.inverse, got.counts, got.last))
    assert torch.equal(got.keys[:u], unique) and not got.keys[u:].any()
    assert torch.equal(got.inverse, inverse)
    assert torch.equal(got.counts[:u], counts) and not got.counts[u:].any()
    assert (got.tags is None) == (tags is None)
    if tags is not None:
        assert torch.equal(got.tags[:u], utags) and not got.tags[u:].any()
    positions = torch.arange(n)
    for j in range(u):
        assert int(got.last[j]) == int(positions[inverse == j].max())


def test_fixed_unique_pairs_of_nothing():
    got = unique_pairs_fixed(torch.empty(0, dtype=torch.int64, device=DEVICE), None)
    assert got.keys.numel() == got.inverse.numel() == 0 and int(got.count) == 0

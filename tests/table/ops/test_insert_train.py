"""The fixed-size lookup's kernels (``hashrec.table.ops.insert.train``) on their own:
hit protection, the found masks and the in-place mask counts. Without CUDA the
kernels run under ``TRITON_INTERPRET=1`` on CPU tensors.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")


@pytest.mark.parametrize("guard", [None, True, False], ids=["unguarded", "inserting", "no_insert"])
def test_protect_hits_sets_the_maximum_only_when_the_call_inserts(guard):
    from hashrec.table.ops.insert.train import SCORE_LFU, protect_hits
    from hashrec.table.storage import TableStorage

    device = "cuda" if torch.cuda.is_available() else "cpu"
    storage = TableStorage.empty(4, 8, 3, device=device)
    storage.scores.copy_(torch.arange(32, device=device) * 10)
    before = storage.scores.clone()
    slots = torch.tensor([3, -1, 5, 30], device=device)
    counts = torch.tensor([1, 4, 2, 7], device=device)
    flag = None if guard is None else torch.tensor(guard, device=device)
    scores = protect_hits(storage, slots, counts, None, SCORE_LFU, guard=flag)
    # LFU: a hit's stored score plus its count; a miss's count alone. Without an insert
    # nothing reads the returned scores, and they are not written.
    new = [31, 4, 52, 307]
    if guard is not False:
        assert scores.tolist() == new
    # The hits' stored scores: the maximum ahead of an insert, else the new scores.
    want = before.clone()
    want[[3, 5, 30]] = torch.iinfo(torch.int64).max if guard is not False else \
        torch.tensor(new, device=device)[[0, 2, 3]]
    assert torch.equal(storage.scores, want)


def test_mask_counts_add_to_the_totals_in_place():
    from hashrec.table.ops.insert.train import add_mask_counts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    masks = [(torch.rand(9000, generator=gen) < p).to(device) for p in (0.0, 0.3, 0.7, 1.0)]
    totals = torch.tensor([1, 2, 3, 4, 5], device=device)
    add_mask_counts(totals, masks, torch.tensor(6, device=device))
    want = [1 + 0, 2 + int(masks[1].sum()), 3 + int(masks[2].sum()), 4 + 9000, 5 + 6]
    assert totals.tolist() == want
    add_mask_counts(totals[:1], masks[3:])
    assert totals[0].item() == 9001
    with pytest.raises(ValueError, match="entries"):
        add_mask_counts(totals, masks)
    with pytest.raises(ValueError, match="masks"):
        add_mask_counts(torch.zeros(7, dtype=torch.int64), masks * 2)


@pytest.mark.parametrize("masked", [False, True], ids=["count", "count_and_active"])
def test_found_masks_split_a_find_over_the_keys_that_take_part(masked):
    from hashrec.table.ops.insert.train import found_masks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    slots = torch.tensor([4, -1, 7, -1, 9, -1, 2], device=device)
    active = torch.tensor([1, 1, 0, 1, 1, 1, 1], dtype=torch.bool, device=device) \
        if masked else None
    count = torch.tensor([5], device=device)  # keys 5 and 6 are padding
    got, hit, pending, live, any_pending = found_masks(slots.clone(), active, count)
    want_live = [True, True, not masked, True, True, False, False]
    assert live.tolist() == want_live
    assert got.tolist() == [s if ok else -1 for s, ok in zip(slots.tolist(), want_live)]
    assert hit.tolist() == [ok and s >= 0 for s, ok in zip(slots.tolist(), want_live)]
    assert pending.tolist() == [ok and s < 0 for s, ok in zip(slots.tolist(), want_live)]
    assert any_pending.item()
    none = found_masks(slots.clone(), None, torch.tensor([1], device=device))
    assert not none[4].item() and none[2].tolist() == [False] * 7

"""Upserts with their rows (``upsert_assign``, ``upsert_embeddings``): the index as
``upsert_slots`` leaves it, the rows stored at (read from) the final slots; and the row
kernels alone (``read_or_init_rows``, ``write_rows``).

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors with tiny
sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import DEVICE, assert_same_index, clone, filled, random_keys  # noqa: E402

from hashrec.table.ops.find import reference as find_ref  # noqa: E402
from hashrec.table.ops.insert import rows as rows_tt  # noqa: E402
from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert import upsert_rows  # noqa: E402


def _rows_of(keys: torch.Tensor, row_dim: int) -> torch.Tensor:
    """A row per key from the key alone (repeats of a key carry the same row)."""
    gen = (keys[:, None] * (torch.arange(row_dim, device=keys.device) + 3)) % 1009
    return gen.to(torch.float32) / 1009


def _batch(row_dim: int = 4):
    """Present keys, many new keys into full buckets (evicting present keys of the same
    batch), repeats of both."""
    base, keys, _ = filled(4, 16, 80, seed=71, row_dim=row_dim)
    present = keys[find_ref.find_slots(base, keys) >= 0]
    gen = torch.Generator().manual_seed(72)
    new = random_keys(40, gen).to(DEVICE)
    batch = torch.cat([present[:30], new, new[:6], present[:3]])
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    return base, batch, scores


def test_upsert_assign_stores_every_placed_row():
    base, batch, scores = _batch()
    rows = _rows_of(batch, base.row_dim)
    want_storage, got_storage = clone(base), clone(base)
    want = upsert_tt.upsert_slots(want_storage, batch, None, scores, True)
    got = upsert_rows.upsert_assign(got_storage, batch, None, scores, rows, True)
    before = find_ref.find_slots(base, batch)
    assert bool(((before >= 0) & (got.slots < 0)).any())  # a miss evicted a present key
    assert torch.equal(got.slots, want.slots)
    assert_same_index(got_storage, want_storage)
    placed = got.slots >= 0
    assert torch.equal(got_storage.values[got.slots[placed]], rows[placed])
    untouched = torch.ones(base.capacity, dtype=torch.bool, device=DEVICE)
    untouched[got.slots[placed]] = False
    assert torch.equal(got_storage.values[untouched], base.values[untouched])


def test_upsert_embeddings_read_stored_rows_and_initialize_the_rest():
    base, batch, scores = _batch(row_dim=5)
    before = find_ref.find_slots(base, batch)
    stored_rows = base.values[before.clamp(min=0), :3]
    storage = clone(base)
    got, out = upsert_rows.upsert_embeddings(storage, batch, None, scores, True, 3, -0.5, 0.5,
                                             9, 0.25)
    kept = (before >= 0) & (got.slots >= 0)
    assert torch.equal(out[kept], stored_rows[kept])
    fresh = got.created | (got.slots < 0)  # new, refused, or present and evicted
    assert bool(((before >= 0) & (got.slots < 0)).any())
    init = rows_tt.init_uniforms(batch, None, 3, seed=9) - 0.5
    torch.testing.assert_close(out[fresh], init[fresh])
    new_slots = got.slots[got.inserted]
    torch.testing.assert_close(storage.values[new_slots, :3], init[got.inserted])
    assert bool((storage.values[new_slots, 3:] == 0.25).all())


def test_upsert_assign_checks_the_rows_shape():
    base, batch, scores = _batch()
    with pytest.raises(ValueError, match="rows must be"):
        upsert_rows.upsert_assign(base, batch, None, scores, torch.zeros(batch.numel(), 3),
                                  True)


@pytest.mark.parametrize("with_source", [False, True], ids=["rows", "source"])
def test_assign_rows_writes_leading_columns_and_scores_of_stored_slots(with_source):
    gen = torch.Generator().manual_seed(77)
    values = torch.randn(40, 6, generator=gen).to(DEVICE)
    scores = torch.zeros(40, dtype=torch.int64, device=DEVICE)
    slots = torch.tensor([7, -1, 3, 12, -1, 30], device=DEVICE)
    rows = torch.randn(9, 4, generator=gen).to(DEVICE)
    row_scores = torch.arange(100, 109, device=DEVICE)
    source = torch.tensor([8, 0, 2, 5, 1, 0], device=DEVICE) if with_source else None
    if not with_source:
        rows, row_scores = rows[:6], row_scores[:6]
    before = values.clone()
    rows_tt.assign_rows(values, slots, rows, source, row_scores, scores)
    at = source if with_source else torch.arange(6, device=DEVICE)
    kept = slots >= 0
    want, want_scores = before.clone(), torch.zeros_like(scores)
    want[slots[kept], :4] = rows[at[kept]]
    want_scores[slots[kept]] = row_scores[at[kept]]
    assert torch.equal(values, want) and torch.equal(scores, want_scores)
    with pytest.raises(ValueError, match="do not fit"):
        rows_tt.assign_rows(values, slots, torch.zeros(6, 7, device=DEVICE))
    with pytest.raises(ValueError, match="come together"):
        rows_tt.assign_rows(values, slots, rows, source, row_scores)


@pytest.mark.parametrize("row_dim,dim", [(5, 3), (40, 34)])  # 40: the wide rows' launch
def test_read_or_init_rows_reads_stored_and_initializes_new_rows(row_dim, dim):
    base, keys, _ = filled(4, 16, 30, seed=31, row_dim=row_dim)
    gen = torch.Generator().manual_seed(32)
    new = random_keys(12, gen).to(DEVICE)
    batch = torch.cat([keys[:8], new, new[:4]])
    scores = torch.ones_like(batch)
    res = upsert_tt.upsert_slots(base, batch, None, scores, False)
    before = base.values.clone()
    got = rows_tt.read_or_init_rows(base.values, batch, None, res.slots, res.created,
                                    res.inserted, dim=dim, lower=-0.5, upper=0.5, seed=7,
                                    state=0.25)
    fresh = res.created | (res.slots < 0)
    init = rows_tt.init_uniforms(batch, None, dim, seed=7) - 0.5
    torch.testing.assert_close(got[fresh], init[fresh])
    stored = ~fresh
    assert bool(stored.any()) and bool(fresh.any())
    assert torch.equal(got[stored], before[res.slots[stored], :dim])
    new_slots = res.slots[res.inserted]
    torch.testing.assert_close(base.values[new_slots, :dim], init[res.inserted])
    assert bool((base.values[new_slots, dim:] == 0.25).all())


def test_read_or_init_rows_of_programs_without_new_keys():
    """A program (64 rows here) whose keys are all stored reads them and initializes
    nothing; the next one, with new keys, initializes those."""
    base, keys, _ = filled(8, 16, 100, seed=33, row_dim=5)
    keys = keys[find_ref.find_slots(base, keys) >= 0]  # the stored ones
    assert keys.numel() >= 66
    gen = torch.Generator().manual_seed(34)
    new = random_keys(40, gen).to(DEVICE)
    new = new[find_ref.find_slots(base, new) < 0][:5]
    batch = torch.cat([keys[:64], new, keys[64:66]])
    res = upsert_tt.upsert_slots(base, batch, None, torch.ones_like(batch), False)
    before = base.values.clone()
    got = rows_tt.read_or_init_rows(base.values, batch, None, res.slots, res.created,
                                    res.inserted, dim=4, lower=0.0, upper=1.0, seed=3)
    fresh = res.created | (res.slots < 0)
    assert not bool(fresh[:64].any()) and bool(fresh[64:69].all())
    stored = ~fresh
    assert torch.equal(got[stored], before[res.slots[stored], :4])
    init = rows_tt.init_uniforms(batch, None, 4, seed=3)
    torch.testing.assert_close(got[fresh], init[fresh])


def test_write_rows_without_mask_writes_every_placed_slot():
    values = torch.zeros(6, 2, device=DEVICE)
    slots = torch.tensor([5, -1, 0], device=DEVICE)
    rows = torch.arange(6, dtype=torch.float32, device=DEVICE).view(3, 2) + 1
    rows_tt.write_rows(values, slots, None, rows)
    expected = torch.zeros(6, 2, device=DEVICE)
    expected[5], expected[0] = rows[0], rows[2]
    assert torch.equal(values, expected)


def test_write_rows_writes_only_masked_slots():
    values = torch.zeros(10, 3, device=DEVICE)
    slots = torch.tensor([4, -1, 7, 2], device=DEVICE)
    mask = torch.tensor([True, True, False, True], device=DEVICE)
    rows = torch.arange(12, dtype=torch.float32, device=DEVICE).view(4, 3) + 1
    upsert_tt.write_rows(values, slots, mask, rows)
    expected = torch.zeros(10, 3, device=DEVICE)
    expected[4], expected[2] = rows[0], rows[3]
    assert torch.equal(values, expected)

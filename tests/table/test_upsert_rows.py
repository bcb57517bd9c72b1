"""Upserts with their rows (``upsert_assign``, ``upsert_embeddings``): the rows of
present keys moved beside the insert give what the upsert followed by one row kernel
gives, whichever slots (the probe's or the final ones) the row kernel beside reads.

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors with tiny
sizes and the work beside runs in order; the ``gpu``-marked test runs it on streams.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import DEVICE, clone, filled, random_keys  # noqa: E402

from hashrec.table.ops.find import reference as find_ref  # noqa: E402
from hashrec.table.ops.insert import rows as rows_tt  # noqa: E402
from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert import upsert_rows  # noqa: E402


@contextlib.contextmanager
def _after_insert(work, slots):
    """The other order the work beside may see: the slots as the call ends them."""
    yield
    if work is not None:
        work(slots)


def _order(monkeypatch, order: str) -> None:
    if order == "final-slots":
        monkeypatch.setattr(upsert_tt, "_beside", _after_insert)


def _rows_of(keys: torch.Tensor, row_dim: int) -> torch.Tensor:
    """A row per key from the key alone (repeats of a key carry the same row)."""
    gen = (keys[:, None] * (torch.arange(row_dim, device=keys.device) + 3)) % 1009
    return gen.to(torch.float32) / 1009


def _batch(row_dim: int = 4, num_buckets: int = 4):
    """Present keys, many new keys into full buckets (evicting present keys of the same
    batch), repeats of both."""
    base, keys, _ = filled(num_buckets, 16, 80, seed=71, row_dim=row_dim)
    present = keys[find_ref.find_slots(base, keys) >= 0]
    gen = torch.Generator().manual_seed(72)
    new = random_keys(40, gen).to(DEVICE)
    batch = torch.cat([present[:30], new, new[:6], present[:3]])
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    return base, batch, scores


def _run(monkeypatch, beside: int, op, *args):
    monkeypatch.setitem(upsert_rows.UPSERT_ROWS, "beside", beside)
    return op(*args)


LANES = {"lanes": 1, "lanes_min": 0, "block": 4, "width": 4}


@pytest.mark.parametrize("lanes,per_sm", [(False, 0), (True, 0), (False, 1)],
                         ids=["block", "lanes", "strided-rows"])
@pytest.mark.parametrize("order", ["probed-slots", "final-slots"])
def test_upsert_assign_beside_equals_rows_after(monkeypatch, order, lanes, per_sm):
    """``per_sm`` 1: the row kernel beside loops over tiles (4 programs here)."""
    monkeypatch.setitem(upsert_rows.UPSERT_ROWS, "per_sm", per_sm)
    if lanes:
        monkeypatch.setattr(upsert_tt, "UPSERT_BLOCK", {**upsert_tt.UPSERT_BLOCK, **LANES})
    base, batch, scores = _batch()
    rows = _rows_of(batch, base.row_dim)
    want_storage, got_storage = clone(base), clone(base)
    before = find_ref.find_slots(base, batch)
    want = _run(monkeypatch, 0, upsert_rows.upsert_assign, want_storage, batch, None, scores,
                rows, True)
    _order(monkeypatch, order)
    got = _run(monkeypatch, 1, upsert_rows.upsert_assign, got_storage, batch, None, scores,
               rows, True)
    assert bool(((before >= 0) & (got.slots < 0)).any())  # a miss evicted a present key
    assert torch.equal(got.slots, want.slots)
    assert torch.equal(got_storage.keys, want_storage.keys)
    assert torch.equal(got_storage.values, want_storage.values)
    placed = got.slots >= 0
    assert torch.equal(got_storage.values[got.slots[placed]], rows[placed])


@pytest.mark.parametrize("per_sm", [0, 1], ids=["rows", "strided-rows"])
@pytest.mark.parametrize("order", ["probed-slots", "final-slots"])
def test_upsert_embeddings_beside_equals_rows_after(monkeypatch, order, per_sm):
    monkeypatch.setitem(upsert_rows.UPSERT_ROWS, "per_sm", per_sm)
    base, batch, scores = _batch(row_dim=5)
    want_storage, got_storage = clone(base), clone(base)
    before = find_ref.find_slots(base, batch)
    stored_rows = base.values[before.clamp(min=0), :3]
    args = (None, scores, True, 3, -0.5, 0.5, 9, 0.25)
    want, want_out = _run(monkeypatch, 0, upsert_rows.upsert_embeddings, want_storage, batch,
                          *args)
    _order(monkeypatch, order)
    got, got_out = _run(monkeypatch, 1, upsert_rows.upsert_embeddings, got_storage, batch,
                        *args)
    evicted = (before >= 0) & (got.slots < 0)
    assert bool(evicted.any())
    assert torch.equal(got.slots, want.slots)
    assert torch.equal(got_out, want_out)
    assert torch.equal(got_storage.values, want_storage.values)
    kept = (before >= 0) & (got.slots >= 0)
    assert torch.equal(got_out[kept], stored_rows[kept])
    init = rows_tt.init_uniforms(batch, None, 3, seed=9) - 0.5
    fresh = got.created | (got.slots < 0)  # new, refused, or present and evicted
    torch.testing.assert_close(got_out[fresh], init[fresh])


def test_read_or_init_rows_parts_make_the_whole():
    base, batch, scores = _batch(row_dim=5)
    res = upsert_tt.upsert_slots(base, batch, None, scores, True)
    whole_values, parts_values = base.values.clone(), base.values.clone()
    args = (batch, None, res.slots, res.created, res.inserted, 3, -0.5, 0.5, 9, 0.25)
    whole = rows_tt.read_or_init_rows(whole_values, *args)
    parts = torch.full_like(whole, float("nan"))
    rows_tt.read_or_init_rows(parts_values, batch, None, res.slots, None, None, 3, -0.5, 0.5,
                              9, 0.25, out=parts, part=rows_tt.STORED_ROWS)
    slotted = res.slots >= 0  # new keys' too: the stored part reads their slots' old rows
    assert bool(parts[slotted].isfinite().all()) and bool(parts[~slotted].isnan().all())
    assert torch.equal(parts_values, base.values)  # the stored part writes no row
    rows_tt.read_or_init_rows(parts_values, *args, out=parts, part=rows_tt.FRESH_ROWS)
    assert torch.equal(parts, whole)
    assert torch.equal(parts_values, whole_values)


@pytest.mark.parametrize("programs", [1, 3, None])
def test_row_kernels_in_strided_programs(programs):
    """Programs looping over tiles (1 or 3 for 10 tiles) write and read what one program
    a tile does."""
    gen = torch.Generator().manual_seed(75)
    n = 10 * 32  # ten tiles of 32 rows at row_dim 128 (write), five of 64 (read)
    slots = torch.randperm(600, generator=gen)[:n].to(DEVICE)
    slots[::7] = -1
    rows = torch.randn(n, 128, generator=gen).to(DEVICE)
    values = torch.zeros(600, 128, device=DEVICE)
    rows_tt.write_rows(values, slots, None, rows, programs=programs)
    kept = slots >= 0
    assert torch.equal(values[slots[kept]], rows[kept])
    assert int((values.abs().sum(1) > 0).sum()) == int(kept.sum())
    keys = torch.arange(n, device=DEVICE)
    out = rows_tt.read_or_init_rows(values, keys, None, slots, None, None, 128, 0.0, 1.0, 0,
                                    out=torch.zeros(n, 128, device=DEVICE),
                                    part=rows_tt.STORED_ROWS, programs=programs)
    assert torch.equal(out[kept], rows[kept]) and not bool(out[~kept].any())


def test_upsert_assign_checks_the_rows_shape():
    base, batch, scores = _batch()
    with pytest.raises(ValueError, match="rows must be"):
        upsert_rows.upsert_assign(base, batch, None, scores, torch.zeros(batch.numel(), 3),
                                  True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dim", [8, 128])
def test_large_upserts_with_rows_beside_on_gpu(monkeypatch, dim):
    """On streams, at sizes where the row kernel and the insert overlap."""
    base, keys, _ = filled(2048, 128, 300_000, seed=73, row_dim=dim)
    present = keys[find_ref.find_slots(base, keys) >= 0]
    gen = torch.Generator().manual_seed(74)
    new = random_keys(400_000, gen).to(DEVICE)
    batch = torch.cat([present[:200_000], new, new[:1000]])
    batch = batch[torch.randperm(batch.numel(), generator=gen).to(DEVICE)]
    scores = torch.randint(0, 100, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    rows = _rows_of(batch, dim)
    before = find_ref.find_slots(base, batch)
    outs = []
    for beside in (0, 1):
        storage = clone(base)
        res = _run(monkeypatch, beside, upsert_rows.upsert_assign, storage, batch, None, scores,
                   rows, True)
        emb_storage = clone(base)
        emb = _run(monkeypatch, beside, upsert_rows.upsert_embeddings, emb_storage, batch,
                   None, scores, True, dim, 0.0, 1.0, 5)
        outs.append((res.slots, storage.values, emb[0].slots, emb[1], emb_storage.values))
    assert bool(((before >= 0) & (outs[1][0] < 0)).any())
    for want, got in zip(*outs):
        assert torch.equal(got, want)

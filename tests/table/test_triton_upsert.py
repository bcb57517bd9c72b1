"""The Triton upsert (find, then insert the misses, no host sync) against find plus the
reference insert, over every insert-program launch (its row kernels:
``test_upsert_rows.py``).

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors with tiny
sizes; on a GPU machine the same tests run compiled, and the ``gpu``-marked ones
repeat them at large sizes (``pytest -m gpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import (  # noqa: E402
    DEVICE,
    assert_same_index,
    capture_launch,
    clone,
    filled,
    random_keys,
    use_probe_form,
)

from hashrec.table.hashing import bucket_of, mix_tagged  # noqa: E402
from hashrec.table.ops.erase import reference as erase_ref  # noqa: E402
from hashrec.table.ops.find import reference as find_ref  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.ops.insert import reference as insert_ref  # noqa: E402
from hashrec.table.ops.insert import triton as insert_tt  # noqa: E402
from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402


def _reference_upsert(storage: TableStorage, keys, tags, scores, allow_evict):
    """find, then insert each missing key once (first occurrence's score) via the reference."""
    slots = find_ref.find_slots(storage, keys, tags)
    miss = torch.nonzero(slots < 0).flatten().cpu()
    host_keys = keys.cpu().tolist()
    host_tags = [0] * len(host_keys) if tags is None else tags.cpu().tolist()
    seen, firsts = set(), []
    for i in miss.tolist():
        ident = (host_keys[i], host_tags[i])
        if ident not in seen:
            seen.add(ident)
            firsts.append(i)
    firsts = torch.tensor(firsts, dtype=torch.int64, device=keys.device)
    res = insert_ref.insert_keys(storage, keys[firsts], None if tags is None else tags[firsts],
                                 scores[firsts], allow_evict)
    return find_ref.find_slots(storage, keys, tags), res


# Insert-program launches (UPSERT_CONFIG, UPSERT_BLOCK): one sorted position per program;
# several, each with runs in registers; several, with runs longer than the registers'
# chunk; the block form alone, with runs of up to 4 or 2 misses in tiles (the rest per
# run, chunked in the last); and the lane form first, over blocks of few positions (runs
# straddle blocks, and the listed blocks outnumber the block form's programs) or many, and
# placing longer runs than the block form's tiles.
# Registers: the block form uncapped in one launch, the probe capped (16 keys, one warp)
# in another. Last, the lane form placing every run itself (no block form after it), the
# long ones chunked.
# The lane form on for calls of any size (by default only for large ones), the block form
# after it (by default, unless the previous call left it little to do).
LANES_ON = {"lanes": 1, "lanes_min": 0, "inline": 0}
INLINE = {**LANES_ON, "inline": 1}
LAUNCHES = {"runs1": ({"runs": 1, "bi": 16}, 0), "runs4": ({"runs": 4, "bi": 16}, 0),
            "runs8-chunked": ({"runs": 8, "bi": 4}, 0),
            "block8-w4": ({"bi": 16}, {"block": 8, "width": 4, "lanes": 0}),
            "block64-w2-chunked": ({"bi": 4}, {"block": 64, "width": 2, "lanes": 0,
                                                "maxnreg": 0}),
            "block1-w1": ({"bi": 16}, {"block": 1, "width": 1, "lanes": 0,
                                       "probe_maxnreg": 80, "probe_keys": 16,
                                       "probe_warps": 1}),
            "lanes-block4-w4": ({"bi": 16}, {**LANES_ON, "block": 4, "width": 4}),
            "lanes-block32-w2-chunked": ({"bi": 4}, {**LANES_ON, "block": 32, "width": 2}),
            "lanes-block2-w1": ({"bi": 16}, {**LANES_ON, "block": 2, "width": 1}),
            "lanes8-block16-w2": ({"bi": 16}, {**LANES_ON, "block": 16, "width": 2,
                                               "lane_width": 8}),
            "lanes-wide16-block4-w2": ({"bi": 16}, {**LANES_ON, "block": 4, "width": 2,
                                                    "wide_lane_width": 16}),
            "inline-block8-w2-chunked": ({"bi": 16}, {**INLINE, "block": 8, "width": 2,
                                                      "inline_bi": 4})}


def _use_launch(monkeypatch, launch: str) -> None:
    config, block = LAUNCHES[launch]
    monkeypatch.setattr(upsert_tt, "UPSERT_CONFIG", {**upsert_tt.UPSERT_CONFIG, **config})
    monkeypatch.setattr(upsert_tt, "UPSERT_BLOCK",
                        {**upsert_tt.UPSERT_BLOCK, **(block or {"block": 0})})


def _check_upsert(base: TableStorage, batch, btags, scores, allow_evict,
                  few_misses: bool = False, hints: dict | None = None) -> None:
    """The upsert of ``batch`` equals find + the reference insert of each miss once
    (``hints``: the launch hints the upsert's storage starts with)."""
    ref_storage, tt_storage = clone(base), clone(base)
    if hints is not None:
        tt_storage.launch_hints = hints
    want, ref = _reference_upsert(ref_storage, batch, btags, scores, allow_evict)
    before = find_ref.find_slots(tt_storage, batch, btags)
    got = upsert_tt.upsert_slots(tt_storage, batch, btags, scores, allow_evict,
                                 few_misses=few_misses)
    assert torch.equal(got.slots, want)
    assert_same_index(tt_storage, ref_storage)
    assert int(got.inserted.sum()) == int((ref.slots >= 0).sum())
    assert torch.equal(got.created, (before < 0) & (got.slots >= 0))
    assert not bool((got.inserted & ~got.created).any())
    assert got.slots[got.inserted].unique().numel() == int(got.inserted.sum())
    ev = got.evicted
    assert ev.shape == batch.shape
    assert sorted(got.evicted_keys[ev].tolist()) == sorted(ref.evicted_keys.tolist())
    assert sorted(got.evicted_scores[ev].tolist()) == sorted(ref.evicted_scores.tolist())


@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
@pytest.mark.parametrize("num_buckets,tagged", [(4, False), (3, True)], ids=["nb4", "nb3-tagged"])
def test_upsert_matches_find_then_reference_insert(monkeypatch, num_buckets, tagged,
                                                   allow_evict, launch):
    _use_launch(monkeypatch, launch)
    _check_mixed_batch(num_buckets, tagged, allow_evict)


@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
@pytest.mark.parametrize("num_buckets,tagged", [(4, False), (3, True)], ids=["nb4", "nb3-tagged"])
@pytest.mark.parametrize("form", ["by-position", "by-word", "three-by-word", "three-masks"])
def test_upsert_with_other_probe_forms_matches_reference(monkeypatch, num_buckets, tagged,
                                                         allow_evict, form):
    """The upsert's probe with every digest match placed by position (WORD_PROBE off), its
    two or three lowest found by word from a tile, or its three lowest from masks (by
    default it takes the two lowest from masks); the lane form finds empty slots from a
    tile of words, or from masks with the probe."""
    use_probe_form(monkeypatch, form)
    _use_launch(monkeypatch, "lanes-block4-w4")
    _check_mixed_batch(num_buckets, tagged, allow_evict)
    _check_short_runs(tagged, allow_evict)


def _check_mixed_batch(num_buckets: int, tagged: bool, allow_evict: bool) -> None:
    """A batch of present keys, new keys and repeats of both."""
    base, keys, tags = filled(num_buckets, 16, 40, seed=5, tagged=tagged)
    gen = torch.Generator().manual_seed(6)
    new = random_keys(50, gen).to(DEVICE)
    batch = torch.cat([keys[:10], new, new[:7], keys[3:6]])  # present, new, repeats
    btags = (torch.randint(0, 3, batch.shape, dtype=torch.int32, generator=gen).to(DEVICE)
             if tagged else None)
    if tagged:
        btags[60:67] = btags[10:17]
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, btags, scores, allow_evict)


@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_upsert_short_runs_into_full_buckets_match_reference(monkeypatch, tagged, allow_evict,
                                                             launch):
    """Many buckets, most runs of 1-4 misses, buckets about 80% full: the block form's
    tiles place most runs (empty slots by rank, victims by score), the rest go per run."""
    _use_launch(monkeypatch, launch)
    _check_short_runs(tagged, allow_evict)


def _check_short_runs(tagged: bool, allow_evict: bool) -> None:
    """Runs of 1-4 misses into 64 buckets of 8 slots, about 80% full."""
    base, keys, tags = filled(64, 8, 420, seed=41, tagged=tagged)
    gen = torch.Generator().manual_seed(42)
    present = keys[find_ref.find_slots(base, keys, tags) >= 0]
    new = random_keys(130, gen).to(DEVICE)
    batch = torch.cat([present[:40], new, new[5:25], present[40:45]])
    btags = None
    if tagged:
        ptags = tags[find_ref.find_slots(base, keys, tags) >= 0]
        ntags = torch.randint(0, 3, new.shape, dtype=torch.int32, generator=gen).to(DEVICE)
        btags = torch.cat([ptags[:40], ntags, ntags[5:25], ptags[40:45]])
    scores = torch.randint(0, 6, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, btags, scores, allow_evict)


@pytest.mark.parametrize("launch,few", [("block8-w4", False), ("lanes-block4-w4", False),
                                        ("lanes-block32-w2-chunked", False),
                                        ("inline-block8-w2-chunked", False),
                                        ("block8-w4", True), ("runs1", True)],
                         ids=["block8-w4", "lanes-block4-w4", "lanes-block32-w2-chunked",
                              "inline-block8-w2-chunked", "block8-w4-few-misses",
                              "runs1-few-misses"])
@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
def test_upsert_reads_no_work_array_past_the_misses(monkeypatch, allow_evict, launch, few):
    """The sorted positions past the misses' count are never written, so never read:
    work arrays that start out as live misses there (position i: bucket i, its key's
    first occurrence, key i; the lane form's 'placed', every block flagged) change no
    result, with persistent block programs (``few_misses``) too; the per-position form
    (block 0) writes every position."""
    _use_launch(monkeypatch, launch)
    real_empty, real_rows = upsert_tt._empty, upsert_tt.aligned_rows

    def rows(count, n, dtype, device):
        out = real_rows(count, n, dtype, device)
        out.copy_(torch.arange(n).expand(count, n))
        return out

    monkeypatch.setattr(upsert_tt, "_empty", lambda *a: real_empty(*a).fill_(1))
    monkeypatch.setattr(upsert_tt, "aligned_rows", rows)
    base, keys, _ = filled(128, 8, 70, seed=8)  # more buckets than keys in the call
    gen = torch.Generator().manual_seed(9)
    new = random_keys(40, gen).to(DEVICE)
    batch = torch.cat([keys[:30], new, new[:5]])
    scores = torch.randint(0, 6, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, None, scores, allow_evict, few_misses=few)


@pytest.mark.parametrize("launch", ["block8-w4", "lanes-block4-w4", "lanes-block2-w1",
                                    "lanes-block32-w2-chunked", "inline-block8-w2-chunked"])
def test_upsert_of_new_keys_into_full_buckets_matches_reference(monkeypatch, launch):
    """Every key new, every bucket full: the lane form leaves every run to the block form
    (victims by score), up to the last block of sorted positions."""
    _use_launch(monkeypatch, launch)
    base, batch, scores, _ = _new_keys_into_full_buckets()
    _check_upsert(base, batch, None, scores, True)


def _new_keys_into_full_buckets():
    """A full table of 16 buckets of 8 slots, a batch of 90 new keys with 11 repeats,
    its scores, and the generator that drew them."""
    base, _, _ = filled(16, 8, 600, seed=61)
    assert bool((base.digests != 0).all())
    gen = torch.Generator().manual_seed(62)
    new = random_keys(90, gen).to(DEVICE)
    batch = torch.cat([new, new[:11]])
    scores = torch.randint(0, 10, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    return base, batch, scores, gen


def _scores_spanning(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """n int64 scores: few values (ties), values within 2**53, a span of exactly 2**54 - 1
    or 2**54 near the top of int64, or the whole int64 range with both ends."""
    if kind == "ties":
        return torch.randint(0, 3, (n,), dtype=torch.int64, generator=gen)
    if kind == "spread":
        return torch.randint(-2**52, 2**52, (n,), dtype=torch.int64, generator=gen)
    if kind.startswith("span"):
        low, span = 2**62, 2**54 - (kind == "span-2**54-1")
        picks = torch.randint(0, 3, (n,), generator=gen)
        inner = low + torch.randint(0, span, (n,), dtype=torch.int64, generator=gen)
        return torch.where(picks == 0, low, torch.where(picks == 1, low + span, inner))
    out = torch.randint(-2**63, 2**63 - 1, (n,), dtype=torch.int64, generator=gen)
    out[::7], out[3::11] = -2**63, 2**63 - 1
    return out


@pytest.mark.parametrize("stored", ["ties", "spread", "span-2**54-1", "span-2**54",
                                    "full-range"])
@pytest.mark.parametrize("launch", ["block8-w4", "lanes-block4-w4", "inline-block8-w2-chunked"])
def test_upsert_evicts_by_score_then_slot_at_any_score_span(monkeypatch, launch, stored):
    """Full buckets: victims by (score asc, slot asc), new keys evicting only where their
    score reaches the victim's, whatever the stored scores span: ties, wide spreads, and
    both ends of int64 (no arithmetic on scores may overflow)."""
    _use_launch(monkeypatch, launch)
    base, _, _ = filled(16, 8, 600, seed=61)
    gen = torch.Generator().manual_seed(63)
    occupied = base.digests != 0
    assert bool(occupied.all())
    base.scores[occupied] = _scores_spanning(stored, int(occupied.sum()), gen).to(DEVICE)
    new = random_keys(90, gen).to(DEVICE)
    batch = torch.cat([new, new[:11]])
    _check_upsert(base, batch, None, _scores_spanning(stored, batch.numel(), gen).to(DEVICE),
                  True)


@pytest.mark.parametrize("launch", ["block8-w4", "lanes-block4-w4", "lanes-block2-w1",
                                    "lanes-wide16-block4-w2"])
@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
@pytest.mark.parametrize("cap,buckets,n_new", [(16, 64, 150), (256, 16, 40)],
                         ids=["bucket16", "bucket256"])
def test_upsert_fills_holes_in_slot_order(monkeypatch, allow_evict, launch, cap, buckets,
                                          n_new):
    """Buckets with empty slots scattered among occupied ones (erased entries): each run
    takes the empty slots by rank, lowest first, across the digest words (the block form
    finds them in two 64-bit masks a bucket up to 128 slots, in a tile of ranks past)."""
    _use_launch(monkeypatch, launch)
    base, keys, _ = filled(buckets, cap, buckets * cap * 7 // 8, seed=51)
    gen = torch.Generator().manual_seed(52)
    occupied = torch.nonzero(base.digests != 0).flatten().cpu()
    holes = occupied[torch.randperm(occupied.numel(), generator=gen)[:occupied.numel() // 3]]
    erase_ref.erase_slots(base, holes.to(DEVICE))
    new = random_keys(n_new, gen).to(DEVICE)
    batch = torch.cat([new, new[:n_new // 8]])
    scores = torch.randint(0, 4, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, None, scores, allow_evict)


@pytest.mark.parametrize("narrow_max_shift", [29, 0], ids=["sort-32bit", "sort-64bit"])
def test_upsert_sort_key_widths_agree(monkeypatch, narrow_max_shift):
    monkeypatch.setattr(upsert_tt, "NARROW_MAX_SHIFT", narrow_max_shift)
    base, keys, _ = filled(8, 16, 90, seed=21)
    gen = torch.Generator().manual_seed(22)
    new = random_keys(60, gen).to(DEVICE)
    batch = torch.cat([keys[:20], new, new[:9]])
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    ref_storage, tt_storage = clone(base), clone(base)
    want, _ = _reference_upsert(ref_storage, batch, None, scores, True)
    assert torch.equal(upsert_tt.upsert_slots(tt_storage, batch, None, scores, True).slots, want)
    assert_same_index(tt_storage, ref_storage)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_large_upsert_matches_reference_on_gpu(monkeypatch, launch):
    _use_launch(monkeypatch, launch)
    base, keys, _ = filled(4096, 128, 400_000, seed=13, row_dim=8)
    gen = torch.Generator().manual_seed(14)
    new = random_keys(300_000, gen).to(DEVICE)
    new = new[find_ref.find_slots(base, new) < 0]
    present = keys[find_ref.find_slots(base, keys) >= 0][:100_000]  # some offers were refused
    batch = torch.cat([present, new])
    scores = torch.randint(0, 100, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    ref_storage, tt_storage = clone(base), clone(base)
    insert_ref.insert_keys(ref_storage, new, None, scores[100_000:], True)
    got = upsert_tt.upsert_slots(tt_storage, batch, None, scores, True)
    assert torch.equal(got.slots, find_ref.find_slots(ref_storage, batch))
    assert_same_index(tt_storage, ref_storage)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("launch", ["runs1", "block8-w4", "block64-w2-chunked"])
@pytest.mark.parametrize("num_buckets,cap,n_fill,n_new", [(65536, 128, 7_000_000, 150_000),
                                                          (2048, 1024, 2_000_000, 6_000)],
                         ids=["cap128", "cap1024"])
def test_large_short_runs_upsert_matches_reference_on_gpu(monkeypatch, launch, num_buckets,
                                                          cap, n_fill, n_new):
    """Buckets 80-95% full and one or two new keys per bucket: mostly short runs, many
    of them evicting (the block form's tiles at size, both bucket sizes)."""
    _use_launch(monkeypatch, launch)
    base, keys, _ = filled(num_buckets, cap, n_fill, seed=15, row_dim=1)
    gen = torch.Generator().manual_seed(16)
    new = random_keys(n_new, gen).to(DEVICE)
    present = keys[find_ref.find_slots(base, keys) >= 0][:n_new]
    batch = torch.cat([present, new, new[: n_new // 10]])
    scores = torch.randint(0, 100, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, None, scores, True)


@pytest.mark.parametrize("launch", ["block8-w4", "lanes-block4-w4"])
@pytest.mark.parametrize("num_buckets,stored", [(4, 50), (32, 200)],
                         ids=["long-runs", "short-runs"])
@pytest.mark.parametrize("allow_evict", [False, True], ids=["no_evict", "evict"])
def test_upsert_active_mask_equals_upsert_of_the_active_keys(monkeypatch, allow_evict,
                                                             num_buckets, stored, launch):
    _use_launch(monkeypatch, launch)
    base, keys, _ = filled(num_buckets, 16, stored, seed=31)
    gen = torch.Generator().manual_seed(32)
    batch = torch.cat([keys[:12], random_keys(40, gen).to(DEVICE)])
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    active = torch.rand(batch.shape, generator=gen).to(DEVICE) < 0.6
    masked_storage, subset_storage = clone(base), clone(base)
    got = upsert_tt.upsert_slots(masked_storage, batch, None, scores, allow_evict, active=active)
    want = upsert_tt.upsert_slots(subset_storage, batch[active], None, scores[active],
                                  allow_evict)
    assert_same_index(masked_storage, subset_storage)
    assert torch.equal(got.slots[active], want.slots)
    assert bool((got.slots[~active] == -1).all())
    assert not bool((got.created[~active] | got.inserted[~active]).any())
    assert torch.equal(got.created[active], want.created)
    assert int(got.evicted.sum()) == int(want.evicted.sum())
    assert int(got.refused) == int(want.refused)
    # Given their slots, the inactive keys read as those (or -1 where this call evicted
    # them); nothing else changes.
    given = find_ref.find_slots(base, batch)
    given_storage = clone(base)
    with_given = upsert_tt.upsert_slots(given_storage, batch, None, scores, allow_evict,
                                        active=active, given_slots=given)
    assert_same_index(given_storage, subset_storage)
    after = find_ref.find_slots(given_storage, batch)
    assert torch.equal(with_given.slots[~active], after[~active])
    assert bool((given[~active] >= 0).any())
    assert torch.equal(with_given.slots[active], want.slots)
    assert int(with_given.refused) == int(want.refused)


@pytest.mark.parametrize("allow_evict", [False, True], ids=["no_evict", "evict"])
def test_upsert_counts_the_absent_keys_it_does_not_place(allow_evict):
    """``refused``: every occurrence of an absent key left without a slot."""
    base, keys, _ = filled(4, 8, 60, seed=41)
    gen = torch.Generator().manual_seed(42)
    new = random_keys(30, gen).to(DEVICE)
    batch = torch.cat([keys[:10], new, new[:5]])
    scores = torch.zeros(batch.shape, dtype=torch.int64, device=DEVICE)  # evicts nothing
    absent = find_ref.find_slots(base, batch) < 0
    got = upsert_tt.upsert_slots(clone(base), batch, None, scores, allow_evict)
    want = int((absent & ~got.created).sum())
    assert want > 0  # the buckets were full: some new keys found no room
    assert int(got.refused) == want


def test_upsert_block_setting_from_environment(monkeypatch):
    from hashrec.table.ops.insert import upsert_block
    monkeypatch.setenv("HASHREC_UPSERT_BLOCK", "32")
    assert upsert_block._block_from_env() == 32
    monkeypatch.setenv("HASHREC_UPSERT_BLOCK", "0")
    assert upsert_block._block_from_env() == 0
    monkeypatch.delenv("HASHREC_UPSERT_BLOCK")
    assert upsert_block._block_from_env() == upsert_block.DEFAULT_BLOCK == 32
    for bad in ("24", "-4", "many"):
        monkeypatch.setenv("HASHREC_UPSERT_BLOCK", bad)
        with pytest.raises(ValueError, match="HASHREC_UPSERT_BLOCK"):
            upsert_block._block_from_env()
    monkeypatch.setenv("HASHREC_UPSERT_LANES", "0")
    assert upsert_block._lanes_from_env() == 0
    monkeypatch.delenv("HASHREC_UPSERT_LANES")
    assert upsert_block._lanes_from_env() == 1  # on unless turned off
    for bad in ("2", "-1", "yes"):
        monkeypatch.setenv("HASHREC_UPSERT_LANES", bad)
        with pytest.raises(ValueError, match="HASHREC_UPSERT_LANES"):
            upsert_block._lanes_from_env()
    monkeypatch.setenv("HASHREC_UPSERT_LANES_MIN", "65536")
    assert upsert_block._lanes_min_from_env() == 65536
    monkeypatch.delenv("HASHREC_UPSERT_LANES_MIN")
    assert upsert_block._lanes_min_from_env() == upsert_block.LANES_MIN == 131072
    monkeypatch.setenv("HASHREC_UPSERT_LANES_MIN", "-1")
    with pytest.raises(ValueError, match="HASHREC_UPSERT_LANES_MIN"):
        upsert_block._lanes_min_from_env()


class _CountedLaunches:
    """Stands in for a kernel: records each launch's grid, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("least,ran", [(0, True), (10_000, False)], ids=["all", "large-only"])
def test_upsert_lane_form_skips_calls_below_its_minimum(monkeypatch, least, ran):
    """With ``lanes_min`` above the call's size the block form alone places the misses,
    with the same outcome."""
    _use_launch(monkeypatch, "lanes-block4-w4")
    monkeypatch.setitem(upsert_tt.UPSERT_BLOCK, "lanes_min", least)
    counted = _CountedLaunches(upsert_tt.upsert_lanes_kernel)
    monkeypatch.setattr(upsert_tt, "upsert_lanes_kernel", counted)
    base, keys, _ = filled(32, 16, 200, seed=61)
    gen = torch.Generator().manual_seed(62)
    batch = torch.cat([keys[:30], random_keys(40, gen).to(DEVICE)])
    scores = torch.randint(0, 8, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, None, scores, True)
    assert bool(counted.grids) == ran


@pytest.mark.parametrize("word", [False, True], ids=["copied", "hint-word"])
@pytest.mark.parametrize("share,inline", [(1, True), (64, False)], ids=["inline", "block-form"])
def test_upsert_lane_form_counts_the_blocks_it_leaves_for_the_next_call(monkeypatch, share,
                                                                          inline, word):
    """With ``inline`` -1 the lane form counts the blocks of sorted positions where a run it
    leaves opens (into full buckets, every run), and the next call on the storage places
    every run in the lane form, without the block form, where those were at most 1 /
    ``inline_share`` of its blocks: the same outcome either way. The count reaches the
    host by a copy, or (``word``) the finalize kernel writes it into the host's word, as
    where kernels reach pinned host memory (on a CPU, a plain word)."""
    _use_launch(monkeypatch, "lanes-block4-w4")
    if word:
        def hint_word(storage):
            held = storage.launch_hints.get("upsert_flagged")
            if held is None:
                held = storage.launch_hints["upsert_flagged"] = torch.full(
                    (1,), -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
            return held
        monkeypatch.setattr(upsert_tt, "_hint_word", hint_word)
        monkeypatch.setattr(upsert_tt, "_note_flagged", None)  # never called
    monkeypatch.setitem(upsert_tt.UPSERT_BLOCK, "inline", -1)
    monkeypatch.setitem(upsert_tt.UPSERT_BLOCK, "inline_share", share)
    counted = _CountedLaunches(upsert_tt.upsert_block_kernel)
    monkeypatch.setattr(upsert_tt, "upsert_block_kernel", counted)
    base, batch, scores, gen = _new_keys_into_full_buckets()
    storage = clone(base)
    upsert_tt.upsert_slots(storage, batch, None, scores, True)
    if torch.cuda.is_available():  # the hint's copy to the host lands without a sync
        torch.cuda.synchronize()
    assert len(counted.grids) == 1  # no hint yet: the block form
    buckets = torch.sort(bucket_of(mix_tagged(batch, None), base.num_buckets)).values
    opens = torch.nonzero(torch.diff(buckets, prepend=buckets[:1] - 1)).flatten()
    flagged = torch.unique(opens // 4).numel()
    assert int(storage.launch_hints["upsert_flagged"][0]) == flagged
    later = random_keys(70, gen).to(DEVICE)
    assert (flagged * share <= -(-later.numel() // 4)) == inline
    _check_upsert(storage, later, None, torch.randint(0, 10, later.shape, dtype=torch.int64,
                                                      generator=gen).to(DEVICE), True,
                  hints=storage.launch_hints)
    assert len(counted.grids) == 1 + (not inline)


@pytest.mark.parametrize("launch", ["runs1", "block8-w4", "lanes-block4-w4"])
@pytest.mark.parametrize("present", [False, True], ids=["new", "present"])
def test_upsert_of_one_key_matches_reference(monkeypatch, launch, present):
    """A call of one key: on a GPU its count is a compile-time 1, which the kernels must
    not reassign under a run-time condition (the build checks every logged launch)."""
    _use_launch(monkeypatch, launch)
    base, keys, _ = filled(16, 8, 20, seed=3)
    batch = keys[:1] if present else random_keys(1, torch.Generator().manual_seed(4))[:1]
    _check_upsert(base, batch.to(DEVICE), None, torch.ones(1, dtype=torch.int64,
                                                            device=DEVICE), True)


@pytest.mark.parametrize("cap,masks,warps", [(16, 1, 1), (16, 0, 2), (256, 1, 1), (200, 1, 2)],
                         ids=["masks", "tile", "segmented-bucket", "wide-bucket"])
def test_upsert_probe_takes_one_warp_from_masks(monkeypatch, cap, masks, warps):
    """The upsert's probe runs on one warp when it reads masks, else on two (unless
    ``probe_warps`` says otherwise)."""
    monkeypatch.setattr(find_tt, "MASK_PROBE", masks)
    seen = capture_launch(monkeypatch, upsert_tt, "_probe_sort_kernel")
    storage = TableStorage.empty(4, cap, 1, device=DEVICE)
    keys = torch.arange(5, device=DEVICE)
    upsert_tt._sort_keys(storage, keys, None, None, None, torch.empty_like(keys))
    assert (seen["num_warps"], seen["MASKS"]) == (
        warps, bool(masks and (cap <= 128 or cap % 128 == 0)))
    monkeypatch.setitem(upsert_tt.UPSERT_BLOCK, "probe_warps", 4)
    upsert_tt._sort_keys(storage, keys, None, None, None, torch.empty_like(keys))
    assert seen["num_warps"] == 4


def test_upsert_block_positions_keep_tiles_near_their_budget():
    from hashrec.table.ops.insert.upsert_block import block_positions
    assert block_positions(64, 8192, 128) == 64
    assert block_positions(64, 8192, 1024) == 8  # the admission counters' buckets
    assert block_positions(64, 8192, 100) == 64  # padded to 128
    assert block_positions(4, 8192, 8) == 4
    assert block_positions(64, 512, 1024) == 1


@pytest.mark.parametrize("op", ["upsert", "insert"])
def test_probes_read_tags_once_a_tagged_entry_is_written(op):
    """An empty storage holds no tag but 0, so a probe without tags skips the tag array;
    the first write with tags turns the comparison on for good."""
    storage = TableStorage.empty(2, 8, 2, device=DEVICE)
    assert not storage.tagged
    key = torch.tensor([7], dtype=torch.int64, device=DEVICE)
    score = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    upsert_tt.upsert_slots(storage, key, None, score, allow_evict=False)
    assert not storage.tagged
    zero = find_tt.find_slots(storage, key)
    assert int(zero) >= 0
    tag = torch.ones(1, dtype=torch.int32, device=DEVICE)
    if op == "upsert":
        upsert_tt.upsert_slots(storage, key, tag, score, allow_evict=False)
    else:
        insert_tt.insert_keys(storage, key, tag, score, allow_evict=False)
    assert storage.tagged
    one = find_tt.find_slots(storage, key, tag)
    assert int(one) >= 0 and int(one) != int(zero)
    assert torch.equal(find_tt.find_slots(storage, key), zero)
    assert torch.equal(find_ref.find_slots(storage, key, tag), one)


@pytest.mark.parametrize("allow_evict", [False, True], ids=["no-evict", "evict"])
@pytest.mark.parametrize("cap,num_buckets", [(6, 40), (8, 32), (40, 6)],
                         ids=["cap6-bytes", "cap8-words", "cap40-words"])
def test_upsert_block_places_runs_into_scattered_empty_slots(monkeypatch, cap, num_buckets,
                                                             allow_evict):
    """Buckets with holes left by erased entries: a run's r-th miss takes the r-th empty
    slot in slot order, found from digest words (capacity a multiple of 4) or bytes."""
    _use_launch(monkeypatch, "block8-w4")
    base, keys, _ = filled(num_buckets, cap, int(0.9 * num_buckets * cap), seed=cap)
    gen = torch.Generator().manual_seed(cap + 1)
    occupied = torch.nonzero(base.digests).flatten()
    holes = occupied[torch.rand(occupied.shape, generator=gen).to(DEVICE) < 0.35]
    erase_ref.erase_slots(base, holes)
    present = keys[find_ref.find_slots(base, keys) >= 0]
    new = random_keys(num_buckets * cap // 3, gen).to(DEVICE)
    batch = torch.cat([present[:20], new, new[:5]])
    scores = torch.randint(0, 6, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    _check_upsert(base, batch, None, scores, allow_evict)

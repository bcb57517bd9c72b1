"""Triton table kernels against the reference ops.

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors with
tiny sizes; on a GPU machine the same tests run compiled, and the ``gpu``-marked
ones repeat them at large sizes (``pytest -m gpu``). The launchers are called
directly so the choice of backend is explicit. The upsert's tests are in
``test_triton_upsert.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import (  # noqa: E402
    DEVICE,
    INT64_MIN,
    PROBE_FORMS,
    assert_same_index,
    capture_launch,
    clone,
    filled,
    random_keys,
    use_probe_form,
)

from hashrec.table import hashing  # noqa: E402
from hashrec.table._triton_hash import hash_keys  # noqa: E402
from hashrec.table.ops.erase import reference as erase_ref  # noqa: E402
from hashrec.table.ops.erase import triton as erase_tt  # noqa: E402
from hashrec.table.ops.export import reference as export_ref  # noqa: E402
from hashrec.table.ops.export import triton as export_tt  # noqa: E402
from hashrec.table.ops.find import reference as find_ref  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.ops.insert import reference as insert_ref  # noqa: E402
from hashrec.table.ops.insert import triton as insert_tt  # noqa: E402
from hashrec.table.ops.optimizer import reference as optim_ref  # noqa: E402
from hashrec.table.ops.optimizer import triton as optim_tt  # noqa: E402
from hashrec.table.optim import (  # noqa: E402
    SparseAdagrad,
    SparseAdam,
    SparseRowWiseAdagrad,
    SparseSGD,
)
from hashrec.table.storage import TableStorage  # noqa: E402


@pytest.mark.parametrize("num_buckets", [1, 7, 1000003])
def test_hash_keys_matches_hashing_bit_for_bit(num_buckets):
    gen = torch.Generator().manual_seed(num_buckets)
    keys = random_keys(300, gen).to(DEVICE)
    tags = torch.randint(-5, 5, keys.shape, dtype=torch.int32, generator=gen).to(DEVICE)
    for t in (None, tags):
        buckets, digests = hash_keys(keys, t, num_buckets)
        h = hashing.mix_tagged(keys, t)
        assert torch.equal(buckets, hashing.bucket_of(h, num_buckets))
        assert torch.equal(digests, hashing.digest_of(h))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("num_buckets,cap,n", [(1, 8, 12), (5, 16, 60), (4, 16, 60),
                                               (3, 128, 200)],
                         ids=["nb1-cap8", "nb5-cap16", "nb4-cap16", "nb3-cap128"])
def test_find_matches_reference(num_buckets, cap, n, tagged):
    storage, keys, tags = filled(num_buckets, cap, n, seed=n, tagged=tagged)
    gen = torch.Generator().manual_seed(1)
    probe = torch.cat([keys, random_keys(20, gen).to(DEVICE)])
    probe_tags = None if tags is None else torch.cat(
        [tags, torch.zeros(probe.numel() - keys.numel(), dtype=torch.int32, device=DEVICE)])
    expected = find_ref.find_slots(storage, probe, probe_tags)
    assert torch.equal(find_tt.find_slots(storage, probe, probe_tags), expected)
    slots, values = find_tt.find_values(storage, probe, probe_tags, dim=3)
    assert torch.equal(slots, expected)
    hit = expected >= 0
    assert torch.equal(values[hit], storage.values[expected[hit], :3])
    assert torch.all(values[~hit] == 0)
    if not tagged:  # every entry has tag 0: the probe may skip the tag array
        storage.tagged = False
        assert torch.equal(find_tt.find_values(storage, probe, None, dim=3)[0], expected)


@pytest.mark.parametrize("form", list(PROBE_FORMS))
@pytest.mark.parametrize("config", [{"block": 32, "num_warps": 1, "maxnreg": 80},
                                    {"block": 16, "num_warps": 2}],
                         ids=["narrow-capped", "block16-warps2"])
def test_find_launches_match_reference(monkeypatch, config, form):
    """Launch settings (keys a program, warps, register cap) and the probe's form change
    no result."""
    monkeypatch.setattr(find_tt, "FIND_CONFIG", config)
    use_probe_form(monkeypatch, form)
    storage, keys, tags = filled(5, 16, 60, seed=3, tagged=True)
    gen = torch.Generator().manual_seed(2)
    probe = torch.cat([keys, random_keys(20, gen).to(DEVICE)])
    probe_tags = torch.cat([tags, torch.zeros(probe.numel() - tags.numel(), dtype=torch.int32,
                                              device=DEVICE)])
    expected = find_ref.find_slots(storage, probe, probe_tags)
    slots, values = find_tt.find_values(storage, probe, probe_tags, dim=3)
    assert torch.equal(slots, expected)
    hit = expected >= 0
    assert torch.equal(values[hit], storage.values[expected[hit], :3])
    assert torch.all(values[~hit] == 0)


@pytest.mark.parametrize("forced,cap,dim,expected", [
    (None, 16, 3, True), (None, 16, 128, True), (None, 16, 256, False), (None, 256, 3, True),
    (None, 200, 3, False), (False, 16, 3, False), (True, 200, 3, True)],
    ids=["narrow", "rows128", "rows256", "segmented-bucket", "wide-bucket", "narrow-forced-off",
         "wide-bucket-forced-on"])
def test_find_launch_picks_the_probe_form(monkeypatch, forced, cap, dim, expected):
    """Rows up to 128 columns from buckets of up to 128 slots (or wider multiples of 128,
    probed by 128-slot segments) probe by word, wider rows or other wide buckets by
    position, unless WORD_PROBE (the environment's HASHREC_WORD_PROBE) sets one form for
    every launch; those buckets take masks (MASK_PROBE)."""
    monkeypatch.setattr(find_tt, "WORD_PROBE", forced)
    seen = capture_launch(monkeypatch, find_tt, "_find_kernel")
    storage = TableStorage.empty(4, cap, dim, device=DEVICE)
    keys = torch.arange(5, device=DEVICE)
    find_tt.launch_find(storage, keys, None, torch.empty_like(keys),
                        torch.empty(5, dim, device=DEVICE))
    assert seen["BY_WORD"] == (find_tt.WORD_PROBE_LOWEST if expected else 0)
    assert seen["MASKS"] == (bool(find_tt.MASK_PROBE) and (cap <= 128 or cap % 128 == 0))


@pytest.mark.parametrize("count", [5, 16, 17, 52])
@pytest.mark.parametrize("dim", [64, 100, 128])
def test_find_wide_rows_at_their_own_launch_match_reference(dim, count):
    """Rows of 64 and 128 columns at the launches chosen for them (``_config``); rows of
    128 columns in calls of at least a program's 16 keys shift the last program back
    (``SHIFT``), fewer mask theirs."""
    storage, keys, _ = filled(4, 16, 40, seed=9, row_dim=dim)
    probe = torch.cat([keys, random_keys(12, torch.Generator().manual_seed(4)).to(DEVICE)])
    probe = probe[torch.randperm(probe.numel(), generator=torch.Generator().manual_seed(5))
                  [:count].to(DEVICE)]
    expected = find_ref.find_slots(storage, probe)
    slots, values = find_tt.find_values(storage, probe, None, dim=dim)
    assert torch.equal(slots, expected)
    hit = expected >= 0
    assert torch.equal(values[hit], storage.values[expected[hit]])
    assert bool((values[~hit] == 0).all())


@pytest.mark.parametrize("name,value", [("HASHREC_WORD_PROBE", "2"),
                                        ("HASHREC_WORD_PROBE", "yes"),
                                        ("HASHREC_WORD_PROBE_LOWEST", "4")])
def test_probe_settings_are_checked(name, value):
    """A probe setting out of its range stops the import with a message naming it."""
    env = {**os.environ, name: value}
    done = subprocess.run([sys.executable, "-c", "import hashrec.table.ops.find.triton"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"{name} must be" in done.stderr


def test_find_empty_and_untagged_probe_misses_tagged_entry():
    storage = TableStorage.empty(2, 8, 2, device=DEVICE)
    keys = torch.tensor([5, INT64_MIN], dtype=torch.int64, device=DEVICE)
    tags = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    insert_tt.insert_keys(storage, keys, tags, torch.zeros(2, dtype=torch.int64, device=DEVICE),
                          allow_evict=False)
    assert torch.equal(find_tt.find_slots(storage, keys), torch.full((2,), -1, device=DEVICE))
    assert bool((find_tt.find_slots(storage, keys, tags) >= 0).all())
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    assert find_tt.find_slots(storage, empty).numel() == 0


def _colliding_bucket(cap: int, seed: int, spread: int = 1
                      ) -> tuple[TableStorage, torch.Tensor, torch.Tensor]:
    """One-bucket storage where many slots share the probe keys' digest.

    Slots hold, in random order: filler keys stamped with the probes' digest (false
    digest matches; with ``spread`` > 1 only about one in ``spread``, the others
    another digest), stale copies of probe keys in empty slots (digest 0), probe
    keys under another tag, and some probe keys themselves.
    """
    gen = torch.Generator().manual_seed(seed)
    storage = TableStorage.empty(1, cap, 2, device=DEVICE)
    probes = random_keys(64, gen)
    digests = hashing.digest_of(hashing.mix64(probes))
    dig = int(torch.mode(digests).values)
    probes = probes[digests == dig][:4]
    if probes.numel() < 2:  # rare: draw keys until two share a digest
        pool = random_keys(4096, gen)
        pool_digests = hashing.digest_of(hashing.mix64(pool))
        probes = pool[pool_digests == int(pool_digests[0])][:4]
        dig = int(pool_digests[0])
    keys = random_keys(cap + 16, gen)
    keys = keys[~torch.isin(keys, probes)][:cap]  # fillers: never a probe key
    tags = torch.zeros(cap, dtype=torch.int32)
    stamp = torch.full((cap,), dig, dtype=torch.uint8)
    kinds = torch.randint(0, 4, (cap,), generator=gen)
    if spread > 1:
        stamp[torch.randint(0, spread, (cap,), generator=gen) != 0] = dig % 255 + 1
    stamp[kinds == 1] = 0  # empty slot with a stale probe key
    keys[kinds == 1] = probes[0]
    tags[kinds == 2] = 1  # probe key under another tag
    keys[kinds == 2] = probes[1 % probes.numel()]
    stored = torch.randperm(cap, generator=gen)[:probes.numel() - 1]
    keys[stored], tags[stored], stamp[stored] = probes[1:], 0, dig
    storage.keys.copy_(keys)
    storage.tags.copy_(tags)
    storage.tagged = True  # tags written by hand, not through an insert op
    storage.digests.copy_(stamp)
    return storage, probes.to(DEVICE), tags.to(DEVICE)


# Later matches confirmed one or four per round; a probe from masks (buckets up to 128
# slots, wider multiples of 128 by segments) confirms them one per round whatever the
# setting, so it runs once, with two lowest (three lowest from masks run in the k-th match
# test below).
_ROUNDS = [(form, wide) for form in PROBE_FORMS for wide in (0, 8)
           if not (PROBE_FORMS[form][2] and (wide or form == "three-masks"))]


@pytest.mark.parametrize("cap,spread", [(6, 1), (8, 1), (40, 1), (128, 1), (256, 4), (1000, 32),
                                        (1024, 32)],
                         ids=["cap6", "cap8", "cap40", "cap128", "cap256", "cap1000", "cap1024"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("form,wide_from", _ROUNDS,
                         ids=[f"{f}-{'four' if w else 'one'}-per-round" for f, w in _ROUNDS])
def test_find_with_colliding_digests_matches_reference(monkeypatch, cap, spread, seed,
                                                       wide_from, form):
    """Slots and rows: most probes' first digest match is not their slot, and most slots
    are candidates, confirmed one or four per probe round; the lowest found by position,
    by word (``WORD_PROBE``) or from masks (``MASK_PROBE``)."""
    monkeypatch.setattr(find_tt, "WIDE_PROBE_MIN_CAP", wide_from)
    use_probe_form(monkeypatch, form)
    storage, probes, _ = _colliding_bucket(cap, seed, spread)
    storage.values.copy_(torch.arange(storage.values.numel(), dtype=storage.values.dtype,
                                      device=DEVICE).view_as(storage.values) + 1)
    for tags in (None, torch.ones_like(probes, dtype=torch.int32)):
        expected = find_ref.find_slots(storage, probes, tags)
        assert torch.equal(find_tt.find_slots(storage, probes, tags), expected)
        slots, values = find_tt.find_values(storage, probes, tags)
        assert torch.equal(slots, expected)
        hit = expected >= 0
        assert torch.equal(values[hit], storage.values[expected[hit]])
        assert bool((values[~hit] == 0).all())
    assert bool((find_ref.find_slots(storage, probes[1:]) >= 0).all())


@pytest.mark.parametrize("matches,at", [
    ((3,), 0), ((2, 9), 1), ((1, 6, 11), 2), ((4, 5, 6), 2), ((4, 5, 6, 7), 3),
    ((0, 1, 9, 13, 14), 4), ((8, 9, 10, 11, 12), 4), ((0, 5, 10), 1), ((4, 7), 1)],
    ids=["1st", "2nd", "3rd-of-3", "3rd-one-word", "4th-one-word", "5th", "5th-two-words",
         "2nd-of-3", "2nd-last-byte"])
@pytest.mark.parametrize("form", list(PROBE_FORMS))
def test_find_confirms_the_kth_digest_match(monkeypatch, matches, at, form):
    """A key whose slot is the k-th of its bucket's digest matches (the others hold other
    keys), the matches spread over the digest words or packed in one."""
    use_probe_form(monkeypatch, form)
    gen = torch.Generator().manual_seed(len(matches) * 16 + at)
    key = random_keys(1, gen)[:1]
    dig = int(hashing.digest_of(hashing.mix64(key))[0])
    storage = TableStorage.empty(1, 16, 2, device=DEVICE)
    fillers = random_keys(40, gen)
    fillers = fillers[fillers != key[0]][:16]
    digests = torch.full((16,), dig % 255 + 1, dtype=torch.uint8)
    digests[list(matches)] = dig
    keys = fillers.clone()
    keys[matches[at]] = key[0]
    storage.keys.copy_(keys)
    storage.digests.copy_(digests)
    want = torch.tensor([matches[at]], device=DEVICE)
    assert torch.equal(find_ref.find_slots(storage, key.to(DEVICE)), want)
    assert torch.equal(find_tt.find_slots(storage, key.to(DEVICE)), want)
    keys[matches[at]] = fillers[-1] if fillers[-1] != key[0] else fillers[0]
    storage.keys.copy_(keys)  # now absent: every match is confirmed and refused
    assert int(find_tt.find_slots(storage, key.to(DEVICE))[0]) == -1


@pytest.mark.parametrize("allow_evict", [True, False], ids=["evict", "no-evict"])
@pytest.mark.parametrize("num_buckets,cap,n_old,n_new", [
    (1, 8, 6, 9), (4, 8, 30, 25), (3, 16, 20, 70), (2, 128, 250, 40), (9, 4, 0, 50)],
    ids=["nb1-cap8", "nb4-cap8", "nb3-cap16", "nb2-cap128", "nb9-cap4-empty"])
def test_insert_matches_reference(num_buckets, cap, n_old, n_new, allow_evict):
    base, _, _ = filled(num_buckets, cap, n_old, seed=n_old + 1, tagged=True)
    gen = torch.Generator().manual_seed(n_new)
    keys = random_keys(n_new, gen)
    keys = keys[find_ref.find_slots(base, keys.to(DEVICE)).cpu() < 0].to(DEVICE)
    tags = torch.randint(0, 2, keys.shape, dtype=torch.int32, generator=gen).to(DEVICE)
    scores = torch.randint(0, 6, keys.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    ref_storage, tt_storage = clone(base), clone(base)
    ref = insert_ref.insert_keys(ref_storage, keys, tags, scores, allow_evict)
    got = insert_tt.insert_keys(tt_storage, keys, tags, scores, allow_evict)
    assert torch.equal(got.slots, ref.slots)
    assert_same_index(tt_storage, ref_storage)
    for field in ("evicted_keys", "evicted_tags", "evicted_scores"):
        assert torch.equal(torch.sort(getattr(got, field)).values,
                           torch.sort(getattr(ref, field)).values), field
    # conservation: placed + refused = offered; placed = new size - old size + evicted
    placed = int((got.slots >= 0).sum())
    assert tt_storage.size() == base.size() + placed - got.evicted_keys.numel()


@pytest.mark.parametrize("allow_evict", [True, False], ids=["evict", "no-evict"])
def test_insert_same_key_under_two_tags_takes_two_slots(allow_evict):
    # Fused tables: one raw id in two tables is two entries with equal score and key.
    keys = torch.tensor([7, 7, -3, -3, 11], dtype=torch.int64, device=DEVICE)
    tags = torch.tensor([1, 0, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    scores = torch.zeros(5, dtype=torch.int64, device=DEVICE)
    ref_storage = TableStorage.empty(1, 8, 2, device=DEVICE)
    tt_storage = TableStorage.empty(1, 8, 2, device=DEVICE)
    ref = insert_ref.insert_keys(ref_storage, keys, tags, scores, allow_evict)
    got = insert_tt.insert_keys(tt_storage, keys, tags, scores, allow_evict)
    assert torch.equal(got.slots, ref.slots)
    assert got.slots.unique().numel() == 5
    assert_same_index(tt_storage, ref_storage)


@pytest.mark.parametrize("cap", [8, 128])
def test_erase_and_export_match_reference(cap):
    storage, keys, _ = filled(3, cap, 3 * cap // 2, seed=cap)
    slots = find_ref.find_slots(storage, keys[::3])
    slots = slots[slots >= 0]
    ref_storage, tt_storage = clone(storage), clone(storage)
    erase_ref.erase_slots(ref_storage, slots)
    erase_tt.erase_slots(tt_storage, slots)
    assert torch.equal(tt_storage.digests, ref_storage.digests)
    for start, end in [(0, storage.capacity), (3, storage.capacity - 5), (4, 4)]:
        assert torch.equal(export_tt.occupied_slots(tt_storage, start, end),
                           export_ref.occupied_slots(ref_storage, start, end))


SPECS = [SparseSGD(lr=0.1), SparseAdagrad(lr=0.1, initial_accumulator_value=0.1),
         SparseRowWiseAdagrad(lr=0.1, initial_accumulator_value=0.1),
         SparseAdam(lr=0.01), SparseAdam(lr=0.01, weight_decay=0.1),
         SparseAdam(lr=0.01, eps=0.5)]  # eps near sqrt(v): its place in the formula shows


@pytest.mark.parametrize("spec", SPECS,
                         ids=["sgd", "adagrad", "rowwise", "adam", "adam-wd", "adam-eps"])
@pytest.mark.parametrize("dim", [1, 5, 16])
def test_optimizer_matches_reference(spec, dim):
    gen = torch.Generator().manual_seed(dim)
    rows = 40
    values = torch.rand(rows, dim + spec.state_dim(dim), generator=gen).to(DEVICE)
    slots = torch.randperm(rows, generator=gen)[:23]
    slots[::4] = -1  # keys without a stored row: skipped by both
    slots = slots.to(DEVICE)
    grads = torch.randn(23, dim, generator=gen).to(DEVICE)
    expected = values.clone()
    stored = slots >= 0
    optim_ref.apply_sparse_update(expected, slots[stored], grads[stored], spec, lr=0.05, step=3)
    untouched = values.clone()
    optim_ref.apply_sparse_update(untouched, slots, grads, spec, lr=0.05, step=3)
    torch.testing.assert_close(untouched, expected, rtol=0, atol=0)
    optim_tt.apply_sparse_update(values, slots, grads, spec, lr=0.05, step=3)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_find_insert_match_reference_on_gpu():
    base, keys, tags = filled(4096, 128, 400_000, seed=11, tagged=True, row_dim=8)
    gen = torch.Generator().manual_seed(12)
    new = random_keys(300_000, gen).to(DEVICE)
    new = new[find_ref.find_slots(base, new) < 0]
    scores = torch.randint(0, 100, new.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    probe = torch.cat([keys, new])
    probe_tags = torch.cat([tags, torch.zeros_like(new, dtype=torch.int32)])
    assert torch.equal(find_tt.find_slots(base, probe, probe_tags),
                       find_ref.find_slots(base, probe, probe_tags))
    ref_storage, tt_storage = clone(base), clone(base)
    ref = insert_ref.insert_keys(ref_storage, new, None, scores, True)
    got = insert_tt.insert_keys(tt_storage, new, None, scores, True)
    assert torch.equal(got.slots, ref.slots)
    assert_same_index(tt_storage, ref_storage)
    assert torch.equal(export_tt.occupied_slots(tt_storage, 0, tt_storage.capacity),
                       export_ref.occupied_slots(ref_storage, 0, ref_storage.capacity))

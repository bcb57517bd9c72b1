"""The upsert's counting sort over buckets (``group_by_bucket``) against torch's stable
sort of the same sort keys, and the upsert with either of them.

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors; the ``gpu``
test repeats the comparison at a training lookup's and a table benchmark's sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from triton_table_helpers import DEVICE, clone, filled, random_keys  # noqa: E402

from hashrec.table.hashing import bucket_of, mix64  # noqa: E402
from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert.group import group_by_bucket  # noqa: E402


def _sort_keys(n: int, num_buckets: int, miss_share: float, wide: bool, seed: int,
               crowd: int = 0) -> tuple[torch.Tensor, int, int]:
    """Upsert-like sort keys: (keys, sentinel, low bits). ``crowd`` > 0 sends that many
    misses to bucket 0; low bits take few values, so equal sort keys repeat."""
    gen = torch.Generator().manual_seed(seed)
    shift = max(1, (num_buckets - 1).bit_length())
    low = 63 - shift if wide else 30 - shift
    sentinel = 0x7FFFFFFFFFFFFFFF if wide else 0x7FFFFFFF
    bucket = torch.randint(0, num_buckets, (n,), generator=gen)
    bucket[:crowd] = 0
    bits = torch.randint(0, 4, (n,), generator=gen) << max(0, low - 2)
    keys = (bucket << low) | bits
    miss = torch.rand(n, generator=gen) < miss_share
    miss[:crowd] = True
    keys = torch.where(miss, keys, sentinel)
    dtype = torch.int64 if wide else torch.int32
    return keys.to(dtype).to(DEVICE), sentinel, low


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("n,num_buckets,share,crowd", [
    (1, 4, 1.0, 0), (1, 4, 0.0, 0), (700, 16, 0.0, 0), (700, 16, 1.0, 0),
    (2500, 64, 0.3, 0), (2500, 3, 0.7, 0), (3000, 1000, 0.05, 40),
], ids=["one-miss", "one-hit", "no-miss", "all-miss", "some", "crowded", "long-run"])
def test_group_by_bucket_equals_stable_sort(wide, n, num_buckets, share, crowd):
    keys, sentinel, low = _sort_keys(n, num_buckets, share, wide, seed=n + num_buckets,
                                     crowd=crowd)
    got_keys, got_perm, misses = group_by_bucket(keys, num_buckets, low, sentinel)
    want_keys, want_perm = torch.sort(keys, stable=True)
    assert got_keys.dtype == keys.dtype and got_perm.dtype == torch.int64
    assert torch.equal(got_keys, want_keys)
    assert torch.equal(got_perm, want_perm)
    assert int(misses) == int((keys != sentinel).sum())


def test_group_by_bucket_of_no_keys():
    keys = torch.empty(0, dtype=torch.int32, device=DEVICE)
    got_keys, got_perm, misses = group_by_bucket(keys, 8, 27, 0x7FFFFFFF)
    assert got_keys.numel() == 0 and got_perm.numel() == 0 and int(misses) == 0


def _upsert_with_either_sort(monkeypatch, base, batch, scores, allow_evict, few):
    """[(result, storage)] of the upsert of ``batch`` into clones of ``base``, grouped by
    torch's sort and by the counting sort (with ``few_misses`` where ``few``)."""
    outcomes = []
    for count in (0, 1):
        monkeypatch.setitem(upsert_tt.UPSERT_GROUP, "count", count)
        storage = clone(base)
        result = upsert_tt.upsert_slots(storage, batch, None, scores, allow_evict,
                                        few_misses=few and count == 1)
        outcomes.append((result, storage))
    return outcomes


@pytest.mark.parametrize("allow_evict", [False, True], ids=["keep", "evict"])
@pytest.mark.parametrize("few", [False, True], ids=["blocks", "persistent"])
def test_upsert_outcome_is_the_same_with_either_sort(monkeypatch, allow_evict, few):
    """The whole upsert (slots, flags, evicted entries, table contents) with the counting
    sort equals the one with torch's full sort; so does it with ``few_misses`` (persistent
    block programs, here one for the 3 blocks of misses)."""
    monkeypatch.setattr(upsert_tt, "PERSISTENT_PER_SM", 1)
    monkeypatch.setattr(upsert_tt, "_multiprocessors", lambda device: 1)
    base, keys, _ = filled(16, 8, 100, seed=71)
    gen = torch.Generator().manual_seed(72)
    batch = torch.cat([keys[:40], random_keys(90, gen).to(DEVICE), keys[:10]])
    batch = batch[torch.randperm(batch.numel(), generator=gen).to(DEVICE)]
    scores = torch.randint(0, 50, batch.shape, dtype=torch.int64, generator=gen).to(DEVICE)
    (a, sa), (b, sb) = _upsert_with_either_sort(monkeypatch, base, batch, scores, allow_evict,
                                                few)
    for name in ("slots", "inserted", "created", "evicted", "refused"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("evicted_keys", "evicted_tags", "evicted_scores"):  # set where evicted
        assert torch.equal(getattr(a, name)[a.evicted], getattr(b, name)[b.evicted]), name
    assert bool(a.evicted.any()) == allow_evict
    for name in ("keys", "scores", "digests"):
        assert torch.equal(getattr(sa, name), getattr(sb, name)), name


def test_upsert_group_setting_from_environment(monkeypatch):
    monkeypatch.delenv("HASHREC_UPSERT_GROUP", raising=False)
    assert upsert_tt._group_from_env() == 1
    monkeypatch.setenv("HASHREC_UPSERT_GROUP", "0")
    assert upsert_tt._group_from_env() == 0
    for bad in ("2", "sort"):
        monkeypatch.setenv("HASHREC_UPSERT_GROUP", bad)
        with pytest.raises(ValueError, match="HASHREC_UPSERT_GROUP"):
            upsert_tt._group_from_env()


@pytest.mark.gpu
@pytest.mark.parametrize("n,num_buckets,share,wide", [
    (393_216, 131_072, 0.0, False), (393_216, 131_072, 0.01, False),
    (1_048_576, 524_288, 0.4, False), (1_048_576, 1_048_576, 1.0, True),
], ids=["lookup-all-hit", "lookup-fresh", "table-ops", "wide"])
def test_large_group_by_bucket_equals_stable_sort_on_gpu(n, num_buckets, share, wide):
    keys, sentinel, low = _sort_keys(n, num_buckets, share, wide, seed=5)
    got = group_by_bucket(keys, num_buckets, low, sentinel)
    want = torch.sort(keys, stable=True)
    assert int(got[2]) == int((keys != sentinel).sum())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _colliding_keys(num_buckets: int) -> tuple[int, int]:
    """Two keys whose 32-bit upsert sort keys are equal (one bucket, the same high hash
    bits) in a table of ``num_buckets`` buckets, found by a search over random keys."""
    shift = max(1, (num_buckets - 1).bit_length())
    gen = torch.Generator().manual_seed(5)
    keys = torch.randint(-2**63, 2**63 - 1, (1 << 22,), generator=gen)
    h = mix64(keys)
    high = (h >> (34 + shift)) & ((1 << (30 - shift)) - 1)  # a logical shift's bits
    s = (bucket_of(h, num_buckets) << (30 - shift)) | high
    s, order = torch.sort(s)
    i = int(torch.nonzero(s[1:] == s[:-1])[0])
    return int(keys[order[i]]), int(keys[order[i + 1]])


@pytest.mark.parametrize("few", [False, True], ids=["blocks", "persistent"])
def test_upsert_names_first_occurrences_among_equal_sort_keys(monkeypatch, few):
    """Two keys of one sort key, each repeated, the other one between its occurrences:
    every occurrence takes its key's slot (the first occurrence's place in the sorted
    order counts the other key's lower positions), as with torch's sort."""
    base, keys, _ = filled(16, 8, 40, seed=73)
    a, b = _colliding_keys(16)
    batch = torch.tensor([b, a, a, b, a], dtype=torch.int64).to(DEVICE)
    batch = torch.cat([keys[:6], batch, keys[6:9]])
    scores = torch.arange(batch.numel(), dtype=torch.int64).to(DEVICE)
    (want, want_storage), (got, storage) = _upsert_with_either_sort(monkeypatch, base, batch,
                                                                    scores, True, few)
    slots, inserted = got.slots, got.inserted
    assert torch.equal(slots, want.slots) and torch.equal(inserted, want.inserted)
    assert torch.equal(storage.keys, want_storage.keys)
    assert slots[6] == slots[9] >= 0 and slots[7] == slots[8] == slots[10] >= 0
    assert inserted[6:11].tolist() == [True, True, False, False, False]

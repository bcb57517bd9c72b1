"""tag_summary: the Triton kernel (interpreted on CPU) equals the torch reference."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.embedding.ops.dedup import reference  # noqa: E402
from hashrec.embedding.ops.dedup import triton as kernel  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sorted_batch(n, num_tags, seed, empty_tags=()):
    g = torch.Generator().manual_seed(seed)
    tags = torch.randint(0, num_tags, (n,), generator=g, dtype=torch.int32)
    for t in empty_tags:
        tags[tags == t] = (t + 1) % num_tags
    ids = torch.randint(-5, 9, (n,), generator=g)
    key = tags.to(torch.int64) * 100 + ids
    order = torch.sort(key, stable=True).indices
    tags, ids = tags[order], ids[order]
    new = torch.ones(n, dtype=torch.bool)
    new[1:] = (tags[1:] != tags[:-1]) | (ids[1:] != ids[:-1])
    return tags, ids, torch.cumsum(new, 0) - 1


@pytest.mark.parametrize("n,num_tags,empty", [(1, 1, ()), (37, 3, ()), (200, 6, (0, 4)),
                                              (64, 5, (4,)), (300, 17, (2, 16))])
@pytest.mark.parametrize("bad", [None, False, True])
def test_kernel_equals_reference(n, num_tags, empty, bad):
    tags, ids, group = (t.to(DEVICE) for t in _sorted_batch(n, num_tags, seed=n + num_tags,
                                                            empty_tags=empty))
    flag = None if bad is None else torch.tensor(bad, device=DEVICE)
    want = reference.tag_summary(tags, ids, group, num_tags, flag)
    got = kernel.tag_summary(tags, ids, group, num_tags, flag)
    assert got.shape == (3, num_tags)
    assert torch.equal(got, want)
    bounds = torch.arange(num_tags + 1, dtype=torch.int32, device=DEVICE)
    starts = torch.searchsorted(tags, bounds)  # as mark_sorted gives them
    assert torch.equal(kernel.tag_summary(tags, ids, group, num_tags, flag, starts), want)
    assert torch.equal(reference.tag_summary(tags, ids, group, num_tags, flag, starts), want)
    firsts = torch.ones(n, dtype=torch.bool, device=DEVICE)
    firsts[1:] = group[1:] != group[:-1]
    counts = torch.bincount(tags.to(torch.int64)[firsts], minlength=num_tags)
    assert got[0].tolist() == counts.tolist()


@pytest.mark.parametrize("n,num_tags", [(1, 1), (50, 3), (300, 7)])
@pytest.mark.parametrize("with_tags", [True, False])
def test_layout_kernel_equals_reference(n, num_tags, with_tags):
    tags, ids, group = (t.to(DEVICE) for t in _sorted_batch(n, num_tags, seed=3 * n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    u = int(group[-1]) + 1
    sorted_tags = tags if with_tags else None
    want = reference.unique_layout(group, order, ids, sorted_tags, u)
    got = kernel.unique_layout(group, order, ids, sorted_tags, u)
    for w, g in zip(want, got):
        assert (w is None and g is None) or torch.equal(w, g)
    keys, _, inverse, row_start = got
    assert row_start[-1] == n and torch.equal(keys[inverse[order]], ids)


def test_layout_of_nothing():
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    keys, tags, inverse, row_start = kernel.unique_layout(empty, empty, empty, None, 0)
    assert keys.numel() == inverse.numel() == 0 and tags is None and row_start.tolist() == [0]


def _padded_batch(seed, features, pad, bits, wide_at=None):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 9, (features,), generator=g)
    n = int(sizes.sum())
    ids = torch.randint(-(1 << 40), 1 << 40, (n + pad,), generator=g)  # padding: junk
    ids[:n] = torch.randint(0, 1 << bits, (n,), generator=g)
    if wide_at is not None and n:
        ids[wide_at % n] = wide_at  # outside [0, 2 ** bits) when wide_at is
    tags = torch.randint(0, 3, (features,), generator=g).sort().values
    meta = torch.cat([sizes.cumsum(0), tags << bits])
    return ids.to(DEVICE), meta.to(DEVICE)


@pytest.mark.parametrize("clamp", [False, True])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("wide_at", [None, -7, 1 << 30])
@pytest.mark.parametrize("features,pad", [(1, 0), (5, 13), (12, 1500)])
def test_padded_keys_kernel_equals_reference(clamp, compact, wide_at, features, pad):
    bits = 12
    ids, meta = _padded_batch(features * 7 + pad, features, pad, bits, wide_at)
    want = reference.padded_keys(ids, meta, 3, bits, clamp, compact)
    got = kernel.padded_keys(ids, meta, 3, bits, clamp, compact)
    assert got[0].dtype == want[0].dtype and torch.equal(got[0], want[0])
    assert bool(got[1]) == bool(want[1])
    assert bool(want[1]) == (wide_at is not None and int(meta[features - 1]) > 0)
    # The same ids read from each feature's own tensor, by the addresses after the tags.
    ends = meta[:features].tolist()
    parts = [ids[start:end].clone() for start, end in zip([0] + ends[:-1], ends)]
    addresses = torch.tensor([part.data_ptr() for part in parts], device=DEVICE)
    junk = torch.full_like(ids, 1 << 45)  # sets N alone
    direct = kernel.padded_keys(junk, torch.cat([meta, addresses]), 3, bits, clamp, compact,
                                features=features)
    assert torch.equal(direct[0], want[0]) and bool(direct[1]) == bool(want[1])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,high", [(1, 3 << 12), (5, 3 << 12), (2100, 3 << 12),
                                    (5000, 1 << 20), (4100, 3)],
                         ids=["one", "five", "three-programs", "five-programs", "repeats"])
def test_mark_sorted_kernel_equals_reference(dtype, n, high):
    """The group numbers run on across the programs (each adds the unique keys of
    every earlier one)."""
    g = torch.Generator().manual_seed(n)
    keys = torch.randint(0, high, (n,), generator=g).sort().values.to(dtype).to(DEVICE)
    want = reference.mark_sorted(keys, 12)
    got = kernel.mark_sorted(keys, 12)
    for w, k in zip(want, got):
        assert k.dtype == w.dtype and torch.equal(k, w)
    # numbers the unique keys from 0, in order
    assert torch.equal(got[3], torch.cumsum(got[2], 0) - 1)
    assert int(got[3][-1]) + 1 == torch.unique(keys).numel()


@pytest.mark.gpu
@pytest.mark.parametrize("n,high", [(1_048_570, 10 << 20), (4_194_304, 1 << 30),
                                    (3_000_000, 50)], ids=["layer", "wide", "repeats"])
def test_large_mark_sorted_equals_reference_on_gpu(n, high):
    """Thousands of programs, each summing the steps of every program before it (more
    than one chunk of them for the larger sizes)."""
    g = torch.Generator().manual_seed(n)
    keys = torch.randint(0, high, (n,), generator=g).sort().values.to(torch.int32).to(DEVICE)
    want = reference.mark_sorted(keys, 20, 10)
    for _ in range(3):
        got = kernel.mark_sorted(keys, 20, 10)
        for w, k in zip(want, got):
            assert k.dtype == w.dtype and torch.equal(k, w)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,num_tags,missing", [
    (1, 1, ()), (1, 4, ()), (700, 5, (0, 2)), (2100, 6, (3, 4, 5)), (2100, 9, (8,)),
    (900, 4, "out"),
], ids=["one", "one-of-four", "gaps", "tail-gone", "padded", "out-of-range"])
def test_mark_sorted_tag_starts_equal_reference(dtype, n, num_tags, missing):
    """Every tag's first position (num_tags: the padding's, after the last tag), with
    tags that have no keys before, between and after the others; "padded" has keys of
    tag num_tags, the padding's; "out-of-range" has tags below 0 and above num_tags (the
    keys of ids too wide, which the dedup flags), whose starts stay in the array."""
    g = torch.Generator().manual_seed(n + num_tags)
    low, high = (-2, num_tags + 4) if missing == "out" else (0, num_tags + 1)
    missing = () if missing == "out" else missing
    tags = torch.randint(low, high, (n,), generator=g)
    for t in missing:
        tags[tags == t] = 1 if t == 0 else t - 1
    if num_tags > 1 and 0 not in missing and low == 0:
        tags[0] = 0
    keys = (tags << 12) + torch.randint(0, 1 << 12, (n,), generator=g)
    keys = keys.sort().values.to(dtype).to(DEVICE)
    want = reference.mark_sorted(keys, 12, num_tags)
    got = kernel.mark_sorted(keys, 12, num_tags)
    assert len(got) == len(want) == 5
    for w, k in zip(want, got):
        assert k.dtype == w.dtype and torch.equal(k, w)
    first_of = {int(t): i for i, t in reversed(list(enumerate(got[1].tolist())))}
    for t in range(num_tags + 1):
        later = [first_of[u] for u in first_of if u >= t]
        assert int(got[4][t]) == (min(later) if later else n)


@pytest.mark.parametrize("compact", [False, True], ids=["int64", "int32"])
def test_padded_sort_reads_ids_by_address_like_from_one_buffer(monkeypatch, compact):
    """``padded_sort`` with ``features``: the keys kernel reads each feature's ids at its
    address; the outputs equal those of the ids copied into one buffer."""
    from hashrec.embedding import dedup_graphs
    from hashrec.table.ops import dispatch

    monkeypatch.setattr(dispatch, "_forced", lambda: True)  # the Triton ops on any device
    g = torch.Generator().manual_seed(5)
    sizes, tags, bits = [40, 7, 25, 60, 3, 9], [0, 0, 2, 3, 3, 3], 12
    values = [torch.randint(0, 50, (k,), generator=g).to(DEVICE) for k in sizes]
    ends = torch.tensor(sizes).cumsum(0)
    meta = torch.cat([ends, torch.tensor(tags) << bits]).to(DEVICE)
    ids = torch.full((200,), 1 << 50, dtype=torch.int64, device=DEVICE)  # padding: junk
    ids[:int(ends[-1])] = torch.cat(values)
    want = dedup_graphs.padded_sort(ids, meta, 4, bits, False, 0, None)
    addresses = torch.tensor([v.data_ptr() for v in values], device=DEVICE)
    junk = torch.full_like(ids, 1 << 50)  # sets N alone
    got = dedup_graphs.padded_sort(junk, torch.cat([meta, addresses]), 4, bits, False, 0,
                                   None, features=len(values))
    for mine, ref in zip(got, want):
        assert torch.equal(mine, ref)

"""The sharded lookup's device ops (route_columns, owner_counts, first_in_runs,
pack_reply, unpack_reply): the Triton kernels (interpreted on CPU) equal the torch
references."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.distributed.ops.merge import reference as merge_reference  # noqa: E402
from hashrec.distributed.ops.merge import triton as merge_kernel  # noqa: E402
from hashrec.distributed.ops.reply import reference as reply_reference  # noqa: E402
from hashrec.distributed.ops.reply import triton as reply_kernel  # noqa: E402
from hashrec.distributed.ops.route import reference  # noqa: E402
from hashrec.distributed.ops.route import triton as kernel  # noqa: E402
from hashrec.table.hashing import owner_of  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INT64 = torch.iinfo(torch.int64)


def _keys(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-1000, 1000, (n,), generator=g)
    if n >= 4:
        keys[:4] = torch.tensor([INT64.min, INT64.max, -1, 0])
    return keys


def _extras(n: int, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    tags = torch.randint(0, 7, (n,), generator=g, dtype=torch.int32)
    counts = torch.randint(1, 50, (n,), generator=g)
    scores = torch.randint(INT64.min, INT64.max, (n,), generator=g)
    return [tags, counts, scores][:count]


@pytest.mark.parametrize("n", [0, 1, 5, 1023, 2500])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("extras", [0, 1, 3])
def test_kernel_equals_reference(n, world, extras):
    keys = _keys(n, seed=n + world).to(DEVICE)
    given = [e.to(DEVICE) for e in _extras(n, extras, seed=n)]
    want = reference.route_columns(keys, given, world)
    got = kernel.route_columns(keys, given, world)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    order, columns, send_counts = got
    assert columns.shape == (n, 1 + extras)
    # Grouped by owner, positions ascending within an owner (stable).
    owners = owner_of(columns[:, 0], world)
    assert bool((owners[1:] >= owners[:-1]).all())
    same = owners[1:] == owners[:-1]
    assert bool((order[1:][same] > order[:-1][same]).all())
    assert int(send_counts.sum()) == n


def test_counts_left_out_when_not_asked():
    keys = _keys(300, seed=3).to(DEVICE)
    for impl in (reference, kernel):
        order, columns, send_counts = impl.route_columns(keys, [], 2, send_counts=False)
        assert send_counts is None and columns.shape == (300, 1)
        torch.testing.assert_close(columns[:, 0], keys[order])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("world", [2, 8])
def test_kernel_equals_reference_at_batch_size(world):
    keys = _keys(1_000_003, seed=world).cuda()
    given = [e.cuda() for e in _extras(keys.numel(), 2, seed=world)]
    want = reference.route_columns(keys, given, world)
    got = kernel.route_columns(keys, given, world)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    mask = keys % 3 != 1
    assert torch.equal(kernel.owner_counts(keys, mask, world),
                       reference.owner_counts(keys, mask, world))


def _sorted_runs(runs: list[int], tagged: bool, seed: int):
    """Runs of distinct (tag, key) pairs from a small pool (so runs share pairs), each
    sorted by (tag, key)."""
    g = torch.Generator().manual_seed(seed)
    pool_keys = torch.tensor([INT64.min, -7, -1, 0, 3, 5, 9, 40, INT64.max] * 4)
    pool_tags = torch.arange(4, dtype=torch.int32).repeat_interleave(9)
    if not tagged:
        pool_keys, pool_tags = pool_keys[:9], pool_tags[:9]
    keys, tags = [], []
    for length in runs:
        pick = torch.randperm(pool_keys.numel(), generator=g)[:length]
        k, t = pool_keys[pick], pool_tags[pick]
        order = torch.sort(k, stable=True).indices
        k, t = k[order], t[order]
        order = torch.sort(t, stable=True).indices
        keys.append(k[order])
        tags.append(t[order])
    return torch.cat(keys), torch.cat(tags) if tagged else None


@pytest.mark.parametrize("runs", [[5], [4, 6], [0, 7, 3], [9, 0, 9, 2], [1, 1, 1, 1, 1]])
@pytest.mark.parametrize("tagged", [False, True])
def test_first_in_runs_equals_reference(runs, tagged):
    keys, tags = _sorted_runs(runs, tagged, seed=sum(runs) + len(runs))
    keys = keys.to(DEVICE)
    tags = None if tags is None else tags.to(DEVICE)
    want_rep, want_active = merge_reference.first_in_runs(keys, tags, runs)
    rep, active = merge_kernel.first_in_runs(keys, tags, runs)
    assert torch.equal(rep, want_rep) and torch.equal(active, want_active)
    if not tagged and sum(runs) > 9:  # more keys than the pool holds: runs share pairs
        assert int(active.sum()) < keys.numel()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_first_in_runs_at_batch_size():
    g = torch.Generator().manual_seed(5)
    runs, keys, tags = [], [], []
    for _ in range(2):
        k = torch.unique(torch.randint(0, 400_000, (300_000,), generator=g))
        t = torch.randint(0, 3, (k.numel(),), generator=g, dtype=torch.int32)
        order = torch.sort(t, stable=True).indices  # keys ascending within each tag
        runs.append(k.numel())
        keys.append(k[order])
        tags.append(t[order])
    keys, tags = torch.cat(keys).cuda(), torch.cat(tags).cuda()
    want = merge_reference.first_in_runs(keys, tags, runs)
    got = merge_kernel.first_in_runs(keys, tags, runs)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("n", [0, 1, 1023, 2500])
@pytest.mark.parametrize("world", [1, 2, 5])
def test_owner_counts_equal_reference(n, world):
    keys = _keys(n, seed=7 * n + world).to(DEVICE)
    mask = (torch.arange(n) % 3 != 1).to(DEVICE)
    want = reference.owner_counts(keys, mask, world)
    got = kernel.owner_counts(keys, mask, world)
    assert torch.equal(got, want) and int(got.sum()) == int(mask.sum())


@pytest.mark.parametrize("m,u,dim", [(0, 3, 4), (1, 1, 1), (150, 40, 16), (70, 70, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reply_ops_equal_reference(m, u, dim, dtype):
    g = torch.Generator().manual_seed(m + u + dim)
    values = torch.randn(u, dim + 3, generator=g).to(dtype)[:, :dim].to(DEVICE)  # a view
    slots = torch.randint(-1, 5, (u,), generator=g).to(DEVICE)
    index = torch.randint(0, u, (m,), generator=g).to(DEVICE)
    packed = reply_kernel.pack_reply(values, slots, index)
    assert torch.equal(packed, reply_reference.pack_reply(values, slots, index))
    order = torch.randperm(m, generator=g).to(DEVICE)
    for got, want in zip(reply_kernel.unpack_reply(packed, order),
                         reply_reference.unpack_reply(packed, order)):
        assert torch.equal(got, want)

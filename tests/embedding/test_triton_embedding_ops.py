"""Triton embedding kernels against the PyTorch references.

Without CUDA they run under ``TRITON_INTERPRET=1`` on CPU tensors at tiny sizes;
``gpu``-marked tests repeat them at large sizes on a CUDA device.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")

from half_precision import ulps  # noqa: E402

from hashrec.embedding.ops.fused import bag_of_positions, dedup, group_positions  # noqa: E402
from hashrec.embedding.ops.fused import triton as fused_tt  # noqa: E402
from hashrec.embedding.ops.pooling import reference as pool_ref  # noqa: E402
from hashrec.embedding.ops.pooling import triton as pool_tt  # noqa: E402
from hashrec.embedding.ops.sequence import reference as seq_ref  # noqa: E402
from hashrec.embedding.ops.sequence import triton as seq_tt  # noqa: E402
from hashrec.table.ops.optimizer import reference as optim_ref  # noqa: E402
from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _bags(batch: int, max_len: int, num_rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (batch,), generator=gen)
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    n = int(offsets[-1])
    inverse = torch.randint(0, num_rows, (n,), generator=gen)
    weights = torch.rand(n, generator=gen)
    return inverse.to(DEVICE), offsets.to(DEVICE), weights.to(DEVICE), gen


# d80: rows at least 64 wide take the pooling kernel with the row stride specialized;
# d64: a power-of-two width of at least 64 is a compile-time constant (EVEN)
def _use_rows(monkeypatch, rows: int) -> None:
    """Chunks of ``rows`` sorted positions (on the default warps); 0: the default tiles."""
    if rows:
        monkeypatch.setattr(fused_tt, "REDUCE_CONFIG", {"rows": rows, "num_warps": 4})


CASES = [(1, 1, 3, 4), (7, 3, 5, 5), (13, 4, 9, 16), (6, 2, 4, 33), (5, 2, 4, 80),
         (4, 2, 3, 64)]
IDS = ["b1-d4", "b7-d5", "b13-d16", "b6-d33", "b5-d80", "b4-d64"]


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@pytest.mark.parametrize("batch,max_len,num_rows,dim", CASES, ids=IDS)
def test_pool_forward_backward_match_reference(batch, max_len, num_rows, dim, mean, weighted):
    inverse, offsets, weights, gen = _bags(batch, max_len, num_rows, seed=batch * dim)
    weights = weights if weighted else None
    rows = torch.randn(num_rows, dim, generator=gen).to(DEVICE)
    torch.testing.assert_close(pool_tt.pool_forward(rows, inverse, offsets, weights, mean),
                               pool_ref.pool_forward(rows, inverse, offsets, weights, mean))
    grad = torch.randn(batch, dim, generator=gen).to(DEVICE)
    torch.testing.assert_close(
        pool_tt.pool_backward(grad, inverse, offsets, weights, mean, num_rows),
        pool_ref.pool_backward(grad, inverse, offsets, weights, mean, num_rows))


@pytest.mark.parametrize("batch,max_len,num_rows,dim", CASES, ids=IDS)
def test_sequence_gather_matches_reference(batch, max_len, num_rows, dim):
    inverse, offsets, _, gen = _bags(batch, max_len, num_rows, seed=batch + dim)
    rows = torch.randn(num_rows, dim, generator=gen).to(DEVICE)
    torch.testing.assert_close(seq_tt.gather_padded(rows, inverse, offsets, max_len),
                               seq_ref.gather_padded(rows, inverse, offsets, max_len))
    grad = torch.randn(batch, max_len, dim, generator=gen).to(DEVICE)
    torch.testing.assert_close(seq_tt.gather_padded_backward(grad, inverse, offsets, num_rows),
                               seq_ref.gather_padded_backward(grad, inverse, offsets, num_rows))


def test_dedup_groups_positions_by_unique_id():
    ids = torch.tensor([5, -1, 5, 2 ** 63 - 1, -1, 5, 0], device=DEVICE)
    d = dedup(ids)
    assert torch.equal(d.unique[d.inverse], ids)
    for r in range(d.unique.numel()):
        pos = d.order[d.row_start[r]:d.row_start[r + 1]]
        assert bool((ids[pos] == d.unique[r]).all())
        assert torch.equal(pos, torch.sort(pos).values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("dim", [4, 64], ids=["d4", "d64"])
def test_pool_from_table_reads_slots_and_fallback(dim, dtype):
    """Table rows of any dtype (half: loaded apart from the float32 fallback rows) are
    pooled in float32."""
    inverse, offsets, weights, gen = _bags(9, 3, 6, seed=3)
    table = torch.randn(20, dim + 3, generator=gen).to(dtype).to(DEVICE)  # + 3 state columns
    slots = torch.tensor([4, -1, 0, 19, -1, 7], device=DEVICE)
    fallback = torch.randn(6, dim, generator=gen).to(DEVICE)
    rows = torch.where((slots >= 0)[:, None], table[slots.clamp(min=0), :dim].float(),
                       fallback)
    got = fused_tt.pool_rows_with_fallback(table, inverse, offsets, weights, True, slots,
                                           fallback, dim=dim)
    torch.testing.assert_close(got, pool_ref.pool_forward(rows, inverse, offsets, weights, True))
    # without fallback rows a missing row reads zeros
    zeros = torch.where((slots >= 0)[:, None], rows, torch.zeros_like(rows))
    got = fused_tt.pool_rows(table, inverse, offsets, weights, True, slots=slots, dim=dim)
    torch.testing.assert_close(got, pool_ref.pool_forward(zeros, inverse, offsets, weights, True))


@pytest.mark.parametrize("dim", [5, 64])
@pytest.mark.parametrize("source", ["rows", "table", "fallback"])
def test_pool_of_one_id_bags_reads_no_offsets(dim, source):
    """``one_id`` (every bag holds one id) pools bit-equal to reading the offsets; the
    offsets given are wrong on purpose, so a read of them would show."""
    gen = torch.Generator().manual_seed(71)
    batch, num_rows = 37, 9
    inverse = torch.randint(0, num_rows, (batch,), generator=gen).to(DEVICE)
    offsets = torch.arange(batch + 1, device=DEVICE)
    wrong = torch.zeros_like(offsets)
    weights = torch.rand(batch, generator=gen).to(DEVICE)
    rows = torch.randn(num_rows, dim, generator=gen).to(DEVICE)
    table = torch.randn(20, dim + 2, generator=gen).to(DEVICE)
    slots = torch.randperm(20, generator=gen)[:num_rows].to(DEVICE)
    slots[1] = -1
    for mean in (False, True):
        if source == "rows":
            want = fused_tt.pool_rows(rows, inverse, offsets, weights, mean)
            got = fused_tt.pool_rows(rows, inverse, wrong, weights, mean, one_id=True)
        else:
            fallback = rows if source == "fallback" else None
            want = fused_tt.pool_rows_with_fallback(table, inverse, offsets, weights, mean,
                                                    slots, fallback, dim=dim)
            got = fused_tt.pool_rows_with_fallback(table, inverse, wrong, weights, mean, slots,
                                                   fallback, dim=dim, one_id=True)
        assert torch.equal(got, want)
    # without offsets at all
    got = fused_tt.pool_rows(rows, inverse, None, weights, False, one_id=True)
    assert torch.equal(got, fused_tt.pool_rows(rows, inverse, offsets, weights, False))
    assert torch.equal(pool_ref.pool_forward(rows, inverse, None, weights, False, one_id=True),
                       pool_ref.pool_forward(rows, inverse, offsets, weights, False))
    for pool in (fused_tt.pool_rows, pool_ref.pool_forward):
        with pytest.raises(ValueError, match="only with one_id"):
            pool(rows, inverse, None, weights, False)


def test_pool_from_table_of_bags_without_ids():
    """No unique ids (every bag empty): no fallback row exists to read, not even for the
    lanes a 16-byte load reads unmasked (on CUDA an empty tensor has no address)."""
    table = torch.randn(4, 64 + 3).to(DEVICE)
    none = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    offsets = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    got = fused_tt.pool_rows_with_fallback(table, none, offsets, None, False, none,
                                           torch.zeros(0, 64, device=DEVICE), dim=64)
    assert torch.equal(got, torch.zeros(2, 64, device=DEVICE))


SPECS = [SparseSGD(lr=0.1), SparseAdagrad(lr=0.1), SparseRowWiseAdagrad(lr=0.1),
         SparseAdam(lr=0.01, weight_decay=0.01)]


@pytest.mark.parametrize("spec", SPECS, ids=["sgd", "adagrad", "rowwise", "adam"])
@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@pytest.mark.parametrize("dim,rows", [(6, 0), (64, 0), (64, 2)], ids=["d6", "d64", "d64-rows2"])
def test_reduce_and_apply_matches_reference_update(monkeypatch, spec, mean, dim, rows):
    _use_rows(monkeypatch, rows)
    num_rows = 8
    inverse, offsets, weights, gen = _bags(11, 3, num_rows, seed=7)
    table = torch.rand(30, dim + spec.state_dim(dim), generator=gen).to(DEVICE)
    slots = torch.randperm(30, generator=gen)[:num_rows].to(DEVICE)
    slots[2] = -1  # a unique id that is not stored gets no update
    grad = torch.randn(11, dim, generator=gen).to(DEVICE)
    row_grads = pool_ref.pool_backward(grad, inverse, offsets, weights, mean, num_rows)
    expected = table.clone()
    keep = slots >= 0
    optim_ref.apply_sparse_update(expected, slots[keep], row_grads[keep], spec, lr=0.05, step=2)
    order, row_start = group_positions(inverse, num_rows)
    bags = bag_of_positions(offsets, inverse.numel())
    fused_tt.reduce_and_apply(grad, bags, order, row_start, slots, table, spec, 0.05, 2,
                              weights, offsets if mean else None)
    torch.testing.assert_close(table, expected, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("spec", SPECS, ids=["sgd", "adagrad", "rowwise", "adam"])
def test_reduce_and_apply_to_half_rows_stores_the_float32_update_rounded(spec, dtype):
    """The update of a float16 / bfloat16 table computes in float32 from its rows and the
    summed gradients, then stores rounded: float16 as the reference does; bfloat16 within
    one ulp (the interpreter truncates float32 to bfloat16 where PyTorch rounds to nearest;
    compiled, the fast float32 square root and division may tip a rounding either way)."""
    num_rows, dim = 8, 6
    inverse, offsets, weights, gen = _bags(11, 3, num_rows, seed=9)
    table = torch.rand(30, dim + spec.state_dim(dim), generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(30, generator=gen)[:num_rows].to(DEVICE)
    grad = torch.randn(11, dim, generator=gen).to(DEVICE)
    row_grads = pool_ref.pool_backward(grad, inverse, offsets, weights, False, num_rows)
    before, expected = table.clone(), table.clone()
    optim_ref.apply_sparse_update(expected, slots, row_grads, spec, lr=0.05, step=2)
    order, row_start = group_positions(inverse, num_rows)
    fused_tt.reduce_and_apply(grad, bag_of_positions(offsets, inverse.numel()), order,
                              row_start, slots, table, spec, 0.05, 2, weights)
    assert table.dtype == dtype and not torch.equal(table, before)
    allowed = 0 if dtype == torch.float16 and DEVICE.type == "cpu" else 1
    assert ulps(table.cpu(), expected.cpu()) <= allowed


def _hot_ids(n: int, num_rows: int, seed: int) -> torch.Tensor:
    """Ids where row 1 takes about 60% and row 4 about 20% of the n positions."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_rows, (n,), generator=gen)
    u = torch.rand(n, generator=gen)
    return torch.where(u < 0.6, 1, torch.where(u < 0.8, 4, ids))


@pytest.mark.parametrize("rows", [0, 8], ids=["rows-default", "rows8"])
@pytest.mark.parametrize("spec", [None, SparseAdam(lr=0.01)], ids=["sum", "adam"])
def test_reduce_spreads_hot_ids_over_chunks(monkeypatch, spec, rows):
    """A hot id's positions span many chunks (of the default size, or of 8 positions)."""
    _use_rows(monkeypatch, rows)
    assert fused_tt._chunk_rows(128, fused_tt._reduce_tiles(spec is not None, 128)) == \
        (rows or (16 if spec is not None else 32))
    n, num_rows, dim = (300, 7, 5) if DEVICE.type == "cpu" else (300_000, 50_000, 128)
    inverse = _hot_ids(n, num_rows, seed=11).to(DEVICE)
    offsets = torch.arange(n + 1, device=DEVICE)
    gen = torch.Generator().manual_seed(12)
    grad = torch.randn(n, dim, generator=gen).to(DEVICE)
    # exact sums (float64): a hot id sums ~1e5 rows, so compare with a float64 oracle
    row_grads = torch.zeros(num_rows, dim, dtype=torch.float64).index_add_(
        0, inverse.cpu(), grad.cpu().double()).float().to(DEVICE)
    if spec is None:
        torch.testing.assert_close(
            pool_tt.pool_backward(grad, inverse, offsets, None, False, num_rows), row_grads,
            rtol=1e-4, atol=1e-3)
        return
    table = torch.rand(num_rows + 3, dim + spec.state_dim(dim), generator=gen).to(DEVICE)
    slots = torch.randperm(num_rows + 3, generator=gen)[:num_rows].to(DEVICE)
    expected = table.clone()
    optim_ref.apply_sparse_update(expected, slots, row_grads, spec, lr=0.05, step=3)
    order, row_start = group_positions(inverse, num_rows)
    fused_tt.reduce_and_apply(grad, torch.arange(n, device=DEVICE), order, row_start, slots,
                              table, spec, 0.05, 3)
    torch.testing.assert_close(table, expected, rtol=1e-4, atol=1e-3)


def test_reduce_tiles_keep_a_warps_elements():
    """The sum alone takes 4096 elements a warp: one warp up to 256 columns, then a warp
    per 4096 elements of the 16-position chunks; fused with the update, 4 warps."""
    tiles = {d: fused_tt._reduce_tiles(False, d) for d in (64, 128, 256, 512, 1024)}
    assert {d: (fused_tt._chunk_rows(d, t), t["num_warps"]) for d, t in tiles.items()} == \
        {64: (64, 1), 128: (32, 1), 256: (16, 1), 512: (16, 2), 1024: (16, 4)}
    assert fused_tt._reduce_tiles(True, 512)["num_warps"] == 4


def test_reduce_of_wide_rows_on_two_warps_matches_reference():
    """Rows of 300 columns (blocks of 512): chunks of 16 positions on two warps."""
    n, num_rows, dim = 90, 7, 300
    inverse = _hot_ids(n, num_rows, seed=81).to(DEVICE)
    grad = torch.randn(n, dim, generator=torch.Generator().manual_seed(82)).to(DEVICE)
    order, row_start = group_positions(inverse, num_rows)
    gidx = torch.arange(n, device=DEVICE)
    torch.testing.assert_close(
        fused_tt.reduce_rows(grad, gidx, order, row_start),
        pool_ref.reduce_positions(grad, gidx, inverse, order, row_start, None),
        rtol=1e-5, atol=1e-5)


def test_reduce_is_bitwise_repeatable():
    n, num_rows, dim = (280, 6, 3) if DEVICE.type == "cpu" else (500_000, 1000, 64)
    inverse = _hot_ids(n, num_rows, seed=21).to(DEVICE)
    offsets = torch.arange(n + 1, device=DEVICE)
    grad = torch.randn(n, dim, generator=torch.Generator().manual_seed(22)).to(DEVICE)
    first = pool_tt.pool_backward(grad, inverse, offsets, None, False, num_rows)
    again = pool_tt.pool_backward(grad, inverse, offsets, None, False, num_rows)
    assert torch.equal(first, again)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_reduce_of_sorted_gradient_rows_is_bit_equal(weighted):
    """gidx and weights given per sorted position (``sorted_gidx``) sum the same terms in
    the same order as per batch position, bit for bit, in the kernel and, on the CPU
    (index_add_ adds in a fixed order there), the reference, whose rows then come from
    ``sorted_rows``."""
    n, num_rows, dim, bags = (260, 6, 5, 40) if DEVICE.type == "cpu" else \
        (400_000, 3000, 64, 50_000)
    gen = torch.Generator().manual_seed(51)
    inverse = _hot_ids(n, num_rows, seed=52).to(DEVICE)
    gidx = torch.randint(0, bags, (n,), generator=gen).to(DEVICE)
    weights = torch.rand(n, generator=gen).to(DEVICE) if weighted else None
    grad = torch.randn(bags, dim, generator=gen).to(DEVICE)
    order, row_start = group_positions(inverse, num_rows)
    sorted_weights = weights[order] if weighted else None
    for impl in (pool_tt, pool_ref) if DEVICE.type == "cpu" else (pool_tt,):
        by_position = impl.reduce_positions(grad, gidx, inverse, order, row_start, weights)
        by_order = impl.reduce_positions(grad, gidx[order], inverse, order, row_start,
                                         sorted_weights, sorted_rows=inverse[order],
                                         sorted_gidx=True)
        assert torch.equal(by_order, by_position)
        assert not torch.equal(  # the flag is read: per position they sum other rows
            impl.reduce_positions(grad, gidx[order], inverse, order, row_start,
                                  sorted_weights), by_position)


def test_reduce_of_covered_rows_skips_no_sum():
    """``covered`` (every row has a position) leaves only the zeroing of rows without one
    out: with every row covered, the sums are bit-equal."""
    n, num_rows, dim = (200, 9, 5) if DEVICE.type == "cpu" else (300_000, 20_000, 128)
    inverse = torch.cat([torch.arange(num_rows), _hot_ids(n, num_rows, seed=61)]).to(DEVICE)
    grad = torch.randn(inverse.numel(), dim, generator=torch.Generator().manual_seed(62)
                       ).to(DEVICE)
    order, row_start = group_positions(inverse, num_rows)
    gidx = torch.arange(inverse.numel(), device=DEVICE)
    assert torch.equal(fused_tt.reduce_rows(grad, gidx, order, row_start, covered=True),
                       fused_tt.reduce_rows(grad, gidx, order, row_start))


@pytest.mark.parametrize("rows", [0, 8], ids=["rows-default", "rows8"])
def test_grouped_reduce_sums_each_group_as_alone(monkeypatch, rows):
    """A join reduces its members' positions together; with the members' row bounds
    every member's rows come out bit-equal to a reduction of that member alone, while
    chunks laid from the first position on group a hot row's terms differently."""
    _use_rows(monkeypatch, rows)
    small = DEVICE.type == "cpu"
    members = [(150, 5), (0, 3), (0, 0), (230, 7)] if small else \
        [(40_003, 300), (0, 3), (0, 0), (70_001, 1000)]
    dim = 5 if small else 64
    gen = torch.Generator().manual_seed(31)
    alone, inverse, grads, bounds = [], [], [], [0]
    for m, (n, num_rows) in enumerate(members):
        ids = _hot_ids(n, max(num_rows, 1), seed=40 + m)
        grad = torch.randn(n, dim, generator=gen)
        order, row_start = group_positions(ids, num_rows)
        alone.append(fused_tt.reduce_rows(grad.to(DEVICE), torch.arange(n, device=DEVICE),
                                          order.to(DEVICE), row_start.to(DEVICE)))
        inverse.append(ids + bounds[-1])
        grads.append(grad)
        bounds.append(bounds[-1] + num_rows)
    inverse, grad = torch.cat(inverse).to(DEVICE), torch.cat(grads).to(DEVICE)
    order, row_start = group_positions(inverse, bounds[-1])
    gidx = torch.arange(inverse.numel(), device=DEVICE)
    grouped = fused_tt.reduce_rows(grad, gidx, order, row_start, groups=bounds)
    assert torch.equal(grouped, torch.cat(alone))
    assert not torch.equal(fused_tt.reduce_rows(grad, gidx, order, row_start), grouped)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", SPECS, ids=["sgd", "adagrad", "rowwise", "adam"])
def test_large_pool_and_fused_update_on_gpu(spec):
    dim, num_rows, batch = 128, 200_000, 100_000
    inverse, offsets, weights, gen = _bags(batch, 4, num_rows, seed=5)
    rows = torch.randn(num_rows, dim, generator=gen).to(DEVICE)
    grad = torch.randn(batch, dim, generator=gen).to(DEVICE)
    torch.testing.assert_close(pool_tt.pool_forward(rows, inverse, offsets, weights, True),
                               pool_ref.pool_forward(rows, inverse, offsets, weights, True))
    row_grads = pool_ref.pool_backward(grad, inverse, offsets, weights, True, num_rows)
    torch.testing.assert_close(
        pool_tt.pool_backward(grad, inverse, offsets, weights, True, num_rows), row_grads,
        rtol=1e-4, atol=1e-5)
    table = torch.rand(num_rows + 7, dim + spec.state_dim(dim), generator=gen).to(DEVICE)
    slots = torch.randperm(num_rows + 7, generator=gen)[:num_rows].to(DEVICE)
    expected = table.clone()
    optim_ref.apply_sparse_update(expected, slots, row_grads, spec, lr=0.05, step=2)
    order, row_start = group_positions(inverse, num_rows)
    fused_tt.reduce_and_apply(grad, bag_of_positions(offsets, inverse.numel()), order,
                              row_start, slots, table, spec, 0.05, 2, weights, offsets)
    torch.testing.assert_close(table, expected, rtol=1e-4, atol=1e-5)

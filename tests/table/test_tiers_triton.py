"""Two-part row kernels (device rows + pinned host rows under UVA) against the reference.

Without CUDA the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors; on a GPU
machine ``second`` is a pinned host tensor read and written in place.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from half_precision import ulps  # noqa: E402

from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD  # noqa: E402, I001
from hashrec.table.tiers.two_part import UVA, TwoPartRows, allocate_host  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPECS = {"sgd": SparseSGD(lr=0.1), "adagrad": SparseAdagrad(lr=0.1),
         "rowwise": SparseRowWiseAdagrad(lr=0.1), "adam": SparseAdam(lr=0.01)}


def _pair(split: int, rows: int, row_dim: int, seed: int,
          dtype: torch.dtype = torch.float32) -> tuple[TwoPartRows, TwoPartRows]:
    """(kernel rows, reference rows) with equal random contents."""
    g = torch.Generator().manual_seed(seed)
    first = torch.rand(max(split, 1), row_dim, generator=g).to(dtype)
    second = torch.rand(max(rows - split, 1), row_dim, generator=g).to(dtype)
    host = allocate_host(second.shape[0], row_dim, dtype, DEVICE)
    host.copy_(second)
    kernel = TwoPartRows(first.to(DEVICE), host, split, DEVICE)
    kernel.mode = UVA
    reference = TwoPartRows(first.clone(), second.clone(), split, torch.device("cpu"))
    return kernel, reference


def _index(n: int, rows: int, seed: int) -> torch.Tensor:
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[:n]


def _same(kernel: TwoPartRows, reference: TwoPartRows) -> None:
    split = reference.split
    torch.testing.assert_close(kernel.first[:split].cpu(), reference.first[:split])
    torch.testing.assert_close(kernel.second.cpu(), reference.second)


@pytest.mark.parametrize("split,rows,n,row_dim", [(0, 9, 5, 3), (7, 7, 7, 5), (5, 13, 0, 4),
                                                  (6, 19, 11, 130)],
                         ids=["all-host", "all-device", "empty", "wide"])
def test_gather_and_scatter_match_reference(split, rows, n, row_dim):
    kernel, reference = _pair(split, rows, row_dim, seed=rows)
    index = _index(n, rows, seed=n)
    for start, width in ((0, row_dim), (1, row_dim - 2)):
        got = kernel.gather(index.to(DEVICE), start, width)
        torch.testing.assert_close(got.cpu(), reference.gather(index, start, width))
    new = torch.randn(n, row_dim - 1, generator=torch.Generator().manual_seed(1))
    kernel.scatter(index.to(DEVICE), new.to(DEVICE), 1)
    reference.scatter(index, new, 1)
    _same(kernel, reference)


@pytest.mark.parametrize("name", SPECS)
def test_update_matches_reference(name):
    spec, dim = SPECS[name], 6
    row_dim = dim + spec.state_dim(dim)
    kernel, reference = _pair(4, 11, row_dim, seed=3)
    index = _index(7, 11, seed=4)
    grads = torch.randn(7, dim, generator=torch.Generator().manual_seed(5))
    kernel.update(index.to(DEVICE), grads.to(DEVICE), spec, 0.1, 2)
    reference.update(index, grads, spec, 0.1, 2)
    _same(kernel, reference)


def test_copy_moves_rows_between_parts():
    kernel, reference = _pair(3, 10, 4, seed=6)
    src, dst = torch.tensor([8, 1, 9]), torch.tensor([0, 5, 2])
    kernel.copy(src.to(DEVICE), dst.to(DEVICE))
    reference.copy(src, dst)
    _same(kernel, reference)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", SPECS)
def test_half_rows_move_exactly_and_update_like_the_reference(name, dtype):
    """Gathers, scatters and copies move half rows bit for bit; an update computes in
    float32 and stores rounded: as the reference does for float16, within one bfloat16 ulp
    interpreted (the interpreter truncates float32 to bfloat16, PyTorch rounds to nearest)
    or compiled (fast float32 square root and division)."""
    spec, dim = SPECS[name], 6
    row_dim = dim + spec.state_dim(dim)
    kernel, reference = _pair(4, 11, row_dim, seed=7, dtype=dtype)
    index = _index(7, 11, seed=8)
    got = kernel.gather(index.to(DEVICE), 0, row_dim)
    assert got.dtype == dtype and torch.equal(got.cpu(), reference.gather(index, 0, row_dim))
    new = torch.rand(7, row_dim, generator=torch.Generator().manual_seed(9))  # float32 in
    kernel.scatter(index.to(DEVICE), new.to(DEVICE), 0)
    reference.scatter(index, new, 0)
    src, dst = torch.tensor([8, 1, 9]), torch.tensor([0, 5, 2])
    kernel.copy(src.to(DEVICE), dst.to(DEVICE))
    reference.copy(src, dst)
    grads = torch.randn(7, dim, generator=torch.Generator().manual_seed(5))
    kernel.update(index.to(DEVICE), grads.to(DEVICE), spec, 0.1, 2)
    reference.update(index, grads, spec, 0.1, 2)
    allowed = 0 if dtype == torch.float16 and not torch.cuda.is_available() else 1
    split = reference.split
    assert ulps(kernel.first[:split].cpu(), reference.first[:split]) <= allowed
    assert ulps(kernel.second.cpu(), reference.second) <= allowed

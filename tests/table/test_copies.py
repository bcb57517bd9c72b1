"""copy_into: several equal-length copies in one launch (interpreted on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.table.ops.copies import copy_into  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _source(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return (torch.rand(n, generator=gen) < 0.5).to(DEVICE)
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    return torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("n", [1, 2047, 5000])
@pytest.mark.parametrize("dtypes", [
    (torch.int64,), (torch.int64, torch.int32), (torch.int64, torch.int32, torch.bool),
    (torch.int64, torch.int32, torch.int64, torch.float32),
], ids=["one", "two", "three", "four"])
def test_copy_into_copies_every_pair_and_nothing_else(n, dtypes):
    sources = [_source(d, n, seed=i) for i, d in enumerate(dtypes)]
    buffers = [torch.zeros(n + 7, dtype=d, device=DEVICE) for d in dtypes]
    copy_into([(b[:n], s) for b, s in zip(buffers, sources)])
    for buffer, source in zip(buffers, sources):
        assert torch.equal(buffer[:n], source)
        assert not bool(buffer[n:].to(torch.float32).any())  # past n: untouched


def test_copy_into_refuses_mismatched_pairs():
    a = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="length"):
        copy_into([(a, torch.zeros(7, dtype=torch.int64, device=DEVICE))])
    with pytest.raises(ValueError, match="dtype"):
        copy_into([(a, torch.zeros(8, dtype=torch.int32, device=DEVICE))])
    with pytest.raises(ValueError, match="contiguous"):
        copy_into([(a, torch.zeros(16, dtype=torch.int64, device=DEVICE)[::2])])
    with pytest.raises(ValueError, match="1 to 4 pairs"):
        copy_into([(a, a)] * 5)
    copy_into([(a[:0], a[:0])])  # nothing to copy

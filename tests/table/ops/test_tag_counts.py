"""Per-tag counts of flagged keys (``hashrec.table.ops.tag_counts``): the Triton kernel
(interpreted on CPU) and the torch reference against a Python count."""

import importlib
import os
from collections import Counter

import pytest
import torch

if not torch.cuda.is_available():  # the kernel interpreted on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hashrec.table.ops.tag_counts import reference  # noqa: E402


def _module(name: str):
    """The op's ``reference`` or ``triton`` module (skips without triton)."""
    if name == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
    return importlib.import_module(f"hashrec.table.ops.tag_counts.{name}")


def _expected(start: torch.Tensor, tags: torch.Tensor, masks: list[torch.Tensor]) -> list:
    """``start`` plus, per mask and tag, the flagged keys; tags outside [0, T) in column T."""
    last = start.shape[1] - 1
    out = start.tolist()
    for k, mask in enumerate(masks):
        counted = Counter(t if 0 <= t < last else last
                          for t, flagged in zip(tags.tolist(), mask.tolist()) if flagged)
        for t, count in counted.items():
            out[k][t] += count
    return out


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("n,sort,masks", [(0, False, 2), (7, False, 1), (1500, True, 2),
                                          (2100, False, 2)],
                         ids=["empty", "n7-one_mask", "n1500-sorted", "n2100-unsorted"])
def test_counts_by_tag_match_a_python_count(n, sort, masks, impl):
    """Tags -1 and past T count in column T; blocks of the kernel span several tags."""
    gen = torch.Generator().manual_seed(n)
    tags = torch.randint(-1, 6, (n,), generator=gen, dtype=torch.int32)  # T = 4: 4, 5 other
    if sort:
        tags = tags.sort().values
    flags = [torch.rand(n, generator=gen) < p for p in (0.3, 0.7)[:masks]]
    start = torch.randint(0, 9, (masks, 5), generator=gen)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sums = start.clone().to(device)
    _module(impl).add_by_tag(sums, tags.to(device), [f.to(device) for f in flags])
    assert sums.tolist() == _expected(start, tags, flags)


def test_mismatched_arrays_are_refused():
    tags = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="sums must be"):
        reference.add_by_tag(torch.zeros(3, 4, dtype=torch.int64), tags,
                             [torch.ones(3, dtype=torch.bool)])
    with pytest.raises(ValueError, match="masks must be"):
        reference.add_by_tag(torch.zeros(1, 4, dtype=torch.int64), tags,
                             [torch.ones(4, dtype=torch.bool)])

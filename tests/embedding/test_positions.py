"""gradient_rows: the Triton kernel against the PyTorch reference (interpreter on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.embedding.ops.positions import reference  # noqa: E402
from hashrec.embedding.ops.positions import triton as kernel  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _features(shapes, seed):
    """Bags of features laid end to end: shapes are (bags, rows per bag) per feature."""
    g = torch.Generator().manual_seed(seed)
    lengths, first, sequence, base = [], [], [], 0
    for bags, per_bag in shapes:
        top = per_bag if per_bag > 1 else 4
        lengths.append(torch.randint(0, top + 1, (bags,), generator=g))
        first.append(torch.arange(bags) * per_bag + base)
        sequence.append(torch.full((bags,), int(per_bag > 1)))
        base += bags * per_bag
    return [torch.cat(t).to(DEVICE) for t in (lengths, first, sequence)]


@pytest.mark.parametrize("shapes", [[(7, 1)], [(5, 3)], [(9, 1), (9, 6), (9, 1)], [(1, 1)],
                                    [(33, 1), (33, 5)]],
                         ids=["pooled", "sequence", "mixed", "one-bag", "odd-sizes"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_rows_match_reference(shapes, seed):
    lengths, first, sequence = _features(shapes, seed)
    lengths[0] = 0  # an empty bag first
    n = int(lengths.sum())
    want = reference.gradient_rows(lengths, first, sequence, n)
    got = kernel.gradient_rows(lengths, first, sequence, n)
    for w, g in zip(want, got):
        assert torch.equal(g.cpu(), w.cpu())


@pytest.mark.parametrize("shapes", [[(7, 1)], [(9, 1), (9, 6), (9, 1)]], ids=["pooled", "mixed"])
def test_gradient_rows_in_a_given_order(shapes):
    """With ``order``, entry q is id order[q]'s: the kernel and the reference both give
    the plain result permuted."""
    lengths, first, sequence = _features(shapes, 5)
    n = int(lengths.sum())
    order = torch.randperm(n, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    plain = reference.gradient_rows(lengths, first, sequence, n)
    for impl in (reference, kernel):
        got = impl.gradient_rows(lengths, first, sequence, n, order)
        for w, g in zip(plain, got):
            assert torch.equal(g.cpu(), w[order].cpu())
    with pytest.raises(ValueError, match="order must be"):
        kernel.gradient_rows(lengths, first, sequence, n, order[1:])


@pytest.mark.parametrize("case", ["ones", "one-long-bag", "empty-runs", "power-law"])
def test_gradient_rows_far_from_an_even_spread_match_reference(case):
    """Bags whose ids are spread nothing like evenly: the search gallops far from its
    guess, either way; bags of one id each are found at the guess."""
    g = torch.Generator().manual_seed(3)
    if case == "ones":
        lengths = torch.ones(37, dtype=torch.int64)
    elif case == "one-long-bag":
        lengths = torch.cat([torch.ones(20, dtype=torch.int64), torch.tensor([300]),
                             torch.ones(25, dtype=torch.int64)])
    elif case == "empty-runs":
        lengths = torch.zeros(90, dtype=torch.int64)
        lengths[[3, 4, 60, 89]] = torch.tensor([5, 1, 40, 2])
    else:
        lengths = (1.0 / torch.rand(70, generator=g)).floor().clamp(max=500).to(torch.int64)
    first = torch.arange(lengths.numel())
    lengths, first = lengths.to(DEVICE), first.to(DEVICE)
    sequence = torch.zeros_like(first)
    n = int(lengths.sum())
    want = reference.gradient_rows(lengths, first, sequence, n)
    got = kernel.gradient_rows(lengths, first, sequence, n)
    for w, r in zip(want, got):
        assert torch.equal(r.cpu(), w.cpu())


def test_no_ids_give_empty_rows():
    lengths = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    first = torch.arange(4, device=DEVICE)
    rows, bags = kernel.gradient_rows(lengths, first, torch.zeros_like(first), 0)
    assert rows.numel() == bags.numel() == 0


def test_mismatched_bag_fields_are_refused():
    lengths = torch.ones(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="first and sequence"):
        kernel.gradient_rows(lengths, lengths[:2], lengths, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gradient_rows_at_training_size_on_gpu():
    # A Taobao-like step: 8192 rows, 6 pooled features and 3 sequences of up to 100.
    lengths, first, sequence = _features([(8192, 1)] * 6 + [(8192, 100)] * 3, seed=5)
    n = int(lengths.sum())
    want = reference.gradient_rows(lengths, first, sequence, n)
    got = kernel.gradient_rows(lengths, first, sequence, n)
    assert all(torch.equal(g, w) for g, w in zip(got, want))

import pytest
import torch

from hashrec.embedding.pooling import gather_sequences, pool_bags


def _bags(lengths, num_rows, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    inverse = torch.randint(0, num_rows, (int(offsets[-1]),), generator=g)
    rows = torch.randn(num_rows, 5, generator=g, dtype=torch.float64)
    weights = torch.rand(inverse.numel(), generator=g, dtype=torch.float64)
    return rows, inverse, offsets, weights


def _naive_pool(rows, inverse, offsets, weights, mean):
    out = []
    for b in range(offsets.numel() - 1):
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        acc = torch.zeros(rows.shape[1], dtype=rows.dtype)
        for i in range(lo, hi):
            acc = acc + rows[inverse[i]] * (1.0 if weights is None else weights[i])
        out.append(acc / max(hi - lo, 1) if mean else acc)
    return torch.stack(out)


CASES = {"mixed": [3, 0, 1, 7, 2], "all-empty": [0, 0, 0], "single": [1], "no-bags": []}


@pytest.mark.parametrize("lengths", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_pool_bags_matches_loop(lengths, mean, weighted):
    rows, inverse, offsets, weights = _bags(lengths, num_rows=4, seed=len(lengths))
    weights = weights if weighted else None
    got = pool_bags(rows, inverse, offsets, weights, mean)
    want = _naive_pool(rows, inverse, offsets, weights, mean).float() if lengths else \
        torch.zeros(0, 5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.reshape(got.shape))
    assert not torch.isnan(got).any()


@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
def test_pool_bags_gradient_sums_per_row(mean):
    rows, inverse, offsets, weights = _bags([3, 0, 4, 1], num_rows=3, seed=7)
    rows = rows.float().requires_grad_()
    grad_out = torch.randn(4, 5)
    pool_bags(rows, inverse, offsets, weights.float(), mean).backward(grad_out)
    expected = rows.detach().clone().requires_grad_()
    _naive_pool(expected, inverse, offsets, weights.float(), mean).backward(grad_out)
    torch.testing.assert_close(rows.grad, expected.grad)


def test_gather_sequences_pads_and_backprops():
    rows = torch.arange(12, dtype=torch.float32).view(4, 3).requires_grad_()
    offsets = torch.tensor([0, 2, 2, 5])
    inverse = torch.tensor([1, 1, 0, 3, 2])
    padded = gather_sequences(rows, inverse, offsets, max_length=3)
    assert padded.shape == (3, 3, 3)
    torch.testing.assert_close(padded[0, :2], rows.detach()[[1, 1]])
    assert not padded[0, 2].any() and not padded[1].any()
    torch.testing.assert_close(padded[2], rows.detach()[[0, 3, 2]])
    padded.sum().backward()
    assert rows.grad[:, 0].tolist() == [1.0, 2.0, 1.0, 1.0]

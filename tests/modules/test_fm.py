import pytest
import torch

from hashrec.modules import FactorizationMachine


def _pairwise(x: torch.Tensor) -> torch.Tensor:
    """The explicit sum over pairs i < j of x_i * x_j."""
    out = torch.zeros(x.shape[0], x.shape[2], dtype=x.dtype)
    for i in range(x.shape[1]):
        for j in range(i + 1, x.shape[1]):
            out = out + x[:, i] * x[:, j]
    return out


@pytest.mark.parametrize("batch, features, dim", [(4, 3, 5), (1, 1, 2), (0, 4, 3), (7, 13, 1)],
                         ids=["b4-n3-d5", "one-feature", "empty-batch", "b7-n13-d1"])
def test_equals_the_sum_over_pairs(batch, features, dim):
    x = torch.randn(batch, features, dim, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(FactorizationMachine()(x), _pairwise(x), atol=1e-5, rtol=1e-5)


def test_gradients():
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(FactorizationMachine(), (x,))
    # d/dx_i = sum of the other features
    FactorizationMachine()(x).sum().backward()
    torch.testing.assert_close(x.grad, x.sum(dim=1, keepdim=True).detach() - x.detach())

import pytest
import torch

from hashrec.modules import PairwiseDot


def _pairs(x: torch.Tensor) -> torch.Tensor:
    features = x.shape[1]
    columns = [(x[:, i] * x[:, j]).sum(-1) for i in range(features)
               for j in range(i + 1, features)]
    return torch.stack(columns, dim=1) if columns else x.new_zeros(x.shape[0], 0)


@pytest.mark.parametrize("batch, features, dim", [(4, 3, 5), (2, 1, 4), (0, 4, 3), (5, 11, 1)],
                         ids=["b4-f3-d5", "one-feature", "empty-batch", "b5-f11-d1"])
def test_equals_the_dot_products_of_the_pairs_in_order(batch, features, dim):
    x = torch.randn(batch, features, dim, generator=torch.Generator().manual_seed(0))
    module = PairwiseDot(features)
    out = module(x)
    assert out.shape == (batch, module.output_dim()) == (batch, features * (features - 1) // 2)
    torch.testing.assert_close(out, _pairs(x), atol=1e-5, rtol=1e-5)


def test_gradients_and_no_state():
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(PairwiseDot(4), (x,))
    assert PairwiseDot(4).state_dict() == {}


def test_scripted_equals_eager():
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(torch.jit.script(PairwiseDot(5))(x), PairwiseDot(5)(x))


def test_no_features_is_an_error():
    with pytest.raises(ValueError, match="num_features must be >= 1, got 0"):
        PairwiseDot(0)

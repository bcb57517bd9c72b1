"""Cross networks of DCN v1 and v2: a layer by hand, several layers against the paper's
matrix form, gradients, errors, TorchScript."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules import Cross, CrossV2


def test_v1_layer_by_hand():
    # x . w = 1 + 6 = 7; 7 x + b + x = [7 + 0.5 + 1, 21 - 1 + 3]
    cross = Cross(2, cross_num=1)
    with torch.no_grad():
        cross.weights[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
        cross.biases[0].copy_(torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(cross(torch.tensor([[1.0, 3.0]])), torch.tensor([[8.5, 23.0]]))


def test_v2_layer_by_hand():
    # U x = 3; V (3) + b = [6, -3 + 1]; x * [6, -2] + x = [7, -2]
    cross = CrossV2(2, cross_num=1, low_rank=1)
    with torch.no_grad():
        cross.down[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
        cross.up[0].weight.copy_(torch.tensor([[2.0], [-1.0]]))
        cross.up[0].bias.copy_(torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(cross(torch.tensor([[1.0, 2.0]])), torch.tensor([[7.0, -2.0]]))


@pytest.mark.parametrize("batch, dim, layers", [(5, 7, 3), (1, 1, 1), (0, 4, 2)],
                         ids=["b5-d7-l3", "b1-d1-l1", "empty-batch"])
def test_v1_equals_the_outer_product_form(batch, dim, layers):
    # The paper's x_{l+1} = x_0 x_l^T w_l + b_l + x_l, with the outer product spelled out.
    torch.manual_seed(0)
    cross = Cross(dim, layers)
    with torch.no_grad():
        for bias in cross.biases:
            bias.normal_()
    x = torch.randn(batch, dim)
    expected = x
    for layer, bias in zip(cross.weights, cross.biases):
        outer = x.unsqueeze(2) * expected.unsqueeze(1)  # (B, D, D)
        expected = outer @ layer.weight[0] + bias + expected
    torch.testing.assert_close(cross(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch, dim, rank, layers", [(5, 7, 3, 3), (2, 3, 8, 2), (0, 4, 2, 1)],
                         ids=["b5-d7-r3-l3", "rank-above-dim", "empty-batch"])
def test_v2_equals_the_full_matrix_form(batch, dim, rank, layers):
    # x_{l+1} = x_0 * (W_l x_l + b_l) + x_l with W_l = V_l U_l (D x D).
    torch.manual_seed(1)
    cross = CrossV2(dim, layers, rank)
    x = torch.randn(batch, dim)
    expected = x
    for down, up in zip(cross.down, cross.up):
        matrix = up.weight @ down.weight
        expected = x * (expected @ matrix.T + up.bias) + expected
    torch.testing.assert_close(cross(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: Cross(5, 2), lambda: CrossV2(5, 2, 3)],
                         ids=["v1", "v2"])
def test_gradients_and_torchscript(make):
    torch.manual_seed(2)
    cross = make().double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cross, (x,))
    cross(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in cross.parameters())
    torch.testing.assert_close(torch.jit.script(cross)(x), cross(x))
    assert cross.output_dim() == 5


@pytest.mark.parametrize("make, message", [
    (lambda: Cross(4, 0), "cross_num=0"),
    (lambda: CrossV2(4, 0), "cross_num=0"),
    (lambda: CrossV2(4, 2, 0), "low_rank=0"),
    (lambda: Cross(0, 2), "input_dim must be > 0"),
], ids=["v1-no-layers", "v2-no-layers", "v2-rank-0", "v1-no-input"])
def test_option_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()

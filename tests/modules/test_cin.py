"""CIN: two layers by hand, the sum over (map, feature) pairs spelled out, gradients,
errors, TorchScript."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules import CIN


def test_two_layers_by_hand():
    # F = 2 features of one column, x = [2, 3]. Layer 1 (one map) weighs the pairs
    # (0, 0), (0, 1), (1, 0), (1, 1) by 1, 0, 0, 1: 2 * 2 + 3 * 3 = 13. Layer 2 (one map
    # over the pairs (map 0, feature 0), (map 0, feature 1)) weighs both by 1, bias 1:
    # 13 * 2 + 13 * 3 + 1 = 66.
    cin = CIN(2, [1, 1])
    with torch.no_grad():
        cin.layers[0].weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
        cin.layers[0].bias.zero_()
        cin.layers[1].weight.copy_(torch.tensor([[1.0, 1.0]]))
        cin.layers[1].bias.fill_(1.0)
    out = cin(torch.tensor([[[2.0], [3.0]]]))
    torch.testing.assert_close(out, torch.tensor([[13.0, 66.0]]))


def _by_loops(cin: CIN, x: torch.Tensor) -> torch.Tensor:
    """X^k[b, h, e] = sum_{i, j} W[h, i, j] X^{k-1}[b, i, e] X^0[b, j, e] + c[h], looped."""
    batch, features, dim = x.shape
    hidden, outputs = x, []
    for layer in cin.layers:
        maps = layer.weight.shape[0]
        weight = layer.weight.reshape(maps, hidden.shape[1], features)
        nxt = torch.zeros(batch, maps, dim, dtype=x.dtype)
        for h in range(maps):
            for i in range(hidden.shape[1]):
                for j in range(features):
                    nxt[:, h] += weight[h, i, j] * hidden[:, i] * x[:, j]
            nxt[:, h] += layer.bias[h]
        outputs.append(nxt.sum(dim=2))
        hidden = nxt
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("batch, features, dim, sizes", [
    (3, 4, 5, [3, 2]), (2, 1, 3, [2]), (0, 3, 2, [2, 2]), (5, 3, 7, [5, 1, 3])],
    ids=["b3-f4-d5-l2", "one-feature", "empty-batch", "b5-f3-d7-l3"])
def test_equals_the_pair_sums(batch, features, dim, sizes):
    torch.manual_seed(0)
    cin = CIN(features, sizes)
    x = torch.randn(batch, features, dim)
    out = cin(x)
    assert out.shape == (batch, sum(sizes)) and cin.output_dim() == sum(sizes)
    with torch.no_grad():
        torch.testing.assert_close(out, _by_loops(cin, x), atol=1e-5, rtol=1e-5)


def test_gradients_and_torchscript():
    torch.manual_seed(1)
    cin = CIN(3, [4, 2]).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cin, (x,))
    torch.testing.assert_close(torch.jit.script(cin)(x), cin(x))


@pytest.mark.parametrize("sizes, features, message", [
    ([], 3, r"cin_layer_size=\[\]"), ([4, 0], 3, r"cin_layer_size=\[4, 0\]"),
    ([2], 0, "num_features must be > 0")], ids=["no-layers", "size-0", "no-features"])
def test_option_errors(sizes, features, message):
    with pytest.raises(ValueError, match=message):
        CIN(features, sizes)

"""WuKong's blocks: the linear compression by hand, the optimized FM against the full
matrix of pairwise dot products, the layer against its parts, gradients, errors,
TorchScript."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules import FactorizationMachineBlock, LinearCompress, MLPOptions, WuKongLayer

MLP_OPTIONS = MLPOptions(hidden_units=(6, 5))


def test_linear_compress_by_hand():
    # rows [1, 2] and [3, -1]: out0 = 1 * row0 + 2 * row1, out1 = -row1
    block = LinearCompress(2, 2)
    with torch.no_grad():
        block.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
    x = torch.tensor([[[1.0, 2.0], [3.0, -1.0]]])
    torch.testing.assert_close(block(x), torch.tensor([[[7.0, 0.0], [-3.0, 1.0]]]))


def _pair_dots(x: torch.Tensor) -> torch.Tensor:
    """(B, n, n): entry (i, j) the dot product of rows i and j, spelled out."""
    n = x.shape[1]
    return torch.stack([torch.stack([(x[:, i] * x[:, j]).sum(-1) for j in range(n)], -1)
                        for i in range(n)], 1)


@pytest.mark.parametrize("batch, rows, dim, compressed, out", [
    (5, 7, 3, 4, 2), (1, 1, 1, 1, 1), (0, 3, 4, 2, 3), (3, 5, 6, 9, 5)],
    ids=["b5-n7-d3-k4", "b1-n1-d1-k1", "empty-batch", "k-above-n"])
def test_fm_block_equals_the_compressed_pair_matrix(batch, rows, dim, compressed, out):
    torch.manual_seed(0)
    block = FactorizationMachineBlock(dim, rows, out, compressed, MLP_OPTIONS)
    x = torch.randn(batch, rows, dim)
    compressed_pairs = _pair_dots(x) @ block.compress
    hidden = block.mlp(block.norm(compressed_pairs.reshape(batch, rows * compressed)))
    expected = block.project(hidden).reshape(batch, out, dim)
    got = block(x)
    assert got.shape == (batch, out, dim)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows, lcb, fmb", [(5, 2, 3), (4, 3, 2), (6, 1, 1)],
                         ids=["residual-identity", "residual-projected-up",
                              "residual-projected-down"])
def test_layer_is_norm_of_blocks_plus_residual(rows, lcb, fmb):
    torch.manual_seed(1)
    layer = WuKongLayer(4, rows, lcb, fmb, 3, MLP_OPTIONS)
    with torch.no_grad():  # a LayerNorm that is not the identity map
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.norm.bias.normal_()
    x = torch.randn(3, rows, 4)
    residual = x if rows == lcb + fmb else torch.einsum("oi,bid->bod", layer.residual.weight, x)
    assert isinstance(layer.residual, torch.nn.Identity) == (rows == lcb + fmb)
    summed = torch.cat([layer.fmb(x), torch.einsum("oi,bid->bod", layer.lcb.weight, x)], 1)
    summed = summed + residual
    mean = summed.mean(-1, keepdim=True)
    var = summed.var(-1, unbiased=False, keepdim=True)
    expected = (summed - mean) / torch.sqrt(var + 1e-5) * layer.norm.weight + layer.norm.bias
    got = layer(x)
    assert got.shape == (3, lcb + fmb, 4) and layer.output_rows() == lcb + fmb
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_gradients_and_torchscript():
    torch.manual_seed(2)
    layer = WuKongLayer(3, 4, 2, 3, 2, MLP_OPTIONS).double()
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    layer(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())
    torch.testing.assert_close(torch.jit.script(layer)(x), layer(x))


@pytest.mark.parametrize("make, message", [
    (lambda: WuKongLayer(4, 3, 0, 2, 2, MLP_OPTIONS), "lcb_feature_num=0; allowed: 1 or more"),
    (lambda: WuKongLayer(4, 3, 2, 0, 2, MLP_OPTIONS), "fmb_feature_num=0; allowed: 1 or more"),
    (lambda: WuKongLayer(4, 3, 2, 2, 0, MLP_OPTIONS),
     "compressed_feature_num=0; allowed: 1 or more"),
    (lambda: LinearCompress(0, 2), "rows_in=0; allowed: 1 or more"),
], ids=["no-lcb-rows", "no-fmb-rows", "no-compression", "no-input-rows"])
def test_option_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()

"""MaskNet: a block against its formula by hand, parallel and serial wiring, widths,
option errors, TorchScript."""

from __future__ import annotations

import math

import pytest
import torch

from hashrec.modules import MaskBlockOptions, MaskNet, MLPOptions
from hashrec.modules.masknet import MaskBlock


def test_a_block_equals_its_formula_by_hand():
    # D = 2, aggregation 1, D_h = 2, hidden_dim 3. Row 1: the mask is ReLU(1 + 2) = 3 ->
    # [3, 1]; masked [9, -1]; linear [9, -1, 4]; LayerNorm [sqrt(1.5), -sqrt(1.5), 0].
    # Row 2: ReLU(1 - 3) = 0 -> mask [0, 4]; masked [0, -4]; linear [0, -4, 4].
    block = MaskBlock(2, 2, MaskBlockOptions(hidden_dim=3, aggregation_dim=1))
    with torch.no_grad():
        block.mask[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
        block.mask[0].bias.zero_()
        block.mask[2].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        block.mask[2].bias.copy_(torch.tensor([0.0, 4.0]))
        block.hidden.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        block.hidden.bias.copy_(torch.tensor([0.0, 0.0, 4.0]))
    x = torch.tensor([[1.0, 2.0], [1.0, -3.0]])
    hidden = torch.tensor([[3.0, -1.0], [3.0, -1.0]])
    r = math.sqrt(1.5)
    expected = torch.tensor([[r, 0.0, 0.0], [0.0, 0.0, r]])
    torch.testing.assert_close(block(x, hidden), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
def test_blocks_read_the_normalized_input_in_parallel_or_chain(parallel):
    torch.manual_seed(0)
    net = MaskNet(6, 3, MaskBlockOptions(hidden_dim=4, reduction_ratio=0.5),
                  parallel=parallel)
    x = torch.randn(5, 6)
    normalized = net.norm(x)
    if parallel:
        expected = torch.cat([block(x, normalized) for block in net.blocks], dim=-1)
    else:
        expected = normalized
        for block in net.blocks:
            expected = block(x, expected)
    out = net(x)
    assert out.shape == (5, net.output_dim()) == (5, 12 if parallel else 4)
    torch.testing.assert_close(out, expected)
    # Every block's mask reads the raw input, aggregated to int(0.5 * D_h) columns of its
    # hidden input's width D_h (TorchEasyRec's MaskBlock): 6, or 4 in later serial blocks.
    assert [block.mask[0].weight.shape for block in net.blocks] == \
        ([(3, 6)] * 3 if parallel else [(3, 6), (2, 6), (2, 6)])
    widths = [block.hidden.in_features for block in net.blocks]
    assert widths == ([6, 6, 6] if parallel else [6, 4, 4])


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
def test_top_mlp_reads_the_blocks_output_and_gradients_reach_every_weight(parallel):
    torch.manual_seed(1)
    net = MaskNet(5, 2, MaskBlockOptions(hidden_dim=3, aggregation_dim=7),
                  MLPOptions(hidden_units=(8, 2)), parallel=parallel)
    assert net.top.layers[0].linear_weight().shape[1] == (6 if parallel else 3)
    x = torch.randn(16, 5)
    out = net(x)
    assert out.shape == (16, 2) and net.output_dim() == 2
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    scripted = torch.jit.script(net)
    torch.testing.assert_close(scripted(x), net(x))


@pytest.mark.parametrize("make,message", [
    (lambda: MaskNet(4, 0, MaskBlockOptions()), "n_mask_blocks=0"),
    (lambda: MaskBlockOptions(hidden_dim=0), "mask_block.hidden_dim=0"),
    (lambda: MaskBlockOptions(aggregation_dim=0), "mask_block.aggregation_dim=0"),
    (lambda: MaskNet(4, 1, MaskBlockOptions(reduction_ratio=0.2)),
     "aggregation width of 0"),
    (lambda: MaskNet(4, 1, MaskBlockOptions(reduction_ratio=float("nan"))),
     "aggregation width of 0"),
], ids=["no-blocks", "hidden-dim-0", "aggregation-dim-0", "small-ratio", "nan-ratio"])
def test_option_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()

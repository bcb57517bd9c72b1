"""The CPU dropout's masks: rate, scale, gradient, seed; torch's where it delegates."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_dropout_zeroes_a_share_p_and_scales_the_kept_values(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 1.0
    y = dropout(x, p, True)
    zeroed = y == 0
    # 1M draws: the share's standard deviation is below 0.0005
    assert abs(float(zeroed.float().mean()) - p) < 0.003
    torch.testing.assert_close(y[~zeroed], x[~zeroed] / (1.0 - p))


def test_cpu_dropout_gradient_is_its_mask_and_scale():
    torch.manual_seed(1)
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.4, True)
    grad = torch.randn_like(y)
    y.backward(grad)
    kept = (y != 0).to(x.dtype)
    torch.testing.assert_close(x.grad, grad * kept / 0.6)


def test_cpu_dropout_draws_from_the_seeded_generator():
    x = torch.ones(257, 19)
    torch.manual_seed(3)
    first = dropout(x, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, True), first)
    assert not torch.equal(dropout(x, 0.5, True), first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cpu_dropout_keeps_dtype_and_shape_and_is_off_in_eval(dtype):
    x = torch.randn(3, 0, 5, dtype=dtype)
    assert dropout(x, 0.5, True).shape == (3, 0, 5)
    x = torch.randn(4, 7, 5, dtype=dtype)
    assert dropout(x, 0.5, True).dtype == dtype
    assert dropout(x, 0.5, False) is x
    assert dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))


def test_other_devices_than_the_cpu_take_torchs_dropout():
    x = torch.ones(3, 4, device="meta")
    assert dropout(x, 0.5, True).device.type == "meta"


def test_the_layer_is_an_nn_dropout_that_scripts():
    layer = Dropout(0.25)
    assert isinstance(layer, torch.nn.Dropout)
    scripted = torch.jit.script(layer)
    x = torch.ones(200, 100)
    for run in (layer, scripted):  # the script draws its masks from rand
        y = run(x)
        assert abs(float((y == 0).float().mean()) - 0.25) < 0.02
        torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))
    layer.eval()
    assert layer(x) is x
    scripted.eval()
    assert torch.equal(scripted(x), x)
    with pytest.raises(ValueError):
        Dropout(1.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dropout_is_torchs():
    x = torch.randn(300, 300, device="cuda")
    torch.manual_seed(7)
    ours = dropout(x, 0.3, True)
    torch.manual_seed(7)
    torch.testing.assert_close(ours, torch.nn.functional.dropout(x, 0.3, True))

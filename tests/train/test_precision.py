import logging

import pytest
import torch

from hashrec.train.errors import TrainError
from hashrec.train.precision import MixedPrecision, as_one_optimizer, unscale_in_backward


class _Scale:
    def __init__(self, scale):
        self.scale = scale

    def get_scale(self):
        return self.scale


def test_unscale_in_backward_divides_gradient():
    x = torch.randn(3, 2, requires_grad=True)
    y = unscale_in_backward(x, _Scale(8.0))
    assert torch.equal(y, x)
    (y * 16.0).sum().backward()
    assert torch.allclose(x.grad, torch.full((3, 2), 2.0))


def test_unscale_in_backward_zeroes_overflow():
    x = torch.randn(2, requires_grad=True)
    y = unscale_in_backward(x, _Scale(4.0))
    (y * torch.tensor([float("inf"), 1.0])).sum().backward()
    assert torch.equal(x.grad, torch.zeros(2))


def test_modes():
    cpu = torch.device("cpu")
    assert MixedPrecision.create("", cpu).dtype is None
    assert MixedPrecision.create("bf16", cpu).dtype is torch.bfloat16
    fp16 = MixedPrecision.create("FP16", cpu)
    assert fp16.scaler is not None and fp16.embedding_hook() is not None
    assert MixedPrecision.create("BF16", cpu).embedding_hook() is None
    with pytest.raises(TrainError, match="mixed_precision"):
        MixedPrecision.create("INT8", cpu)


def test_bf16_autocast_context():
    mp = MixedPrecision.create("BF16", torch.device("cpu"))
    layer = torch.nn.Linear(4, 4)
    with mp.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16



@pytest.mark.parametrize("mode", ["", "BF16"], ids=["float32", "bf16"])
def test_grad_scaler_without_fp16_is_named_as_ignored(mode, caplog):
    from hashrec.config.train_pb2 import GradScaler

    scaler_config = GradScaler(init_scale=1024.0)
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        mp = MixedPrecision.create(mode, torch.device("cpu"), scaler_config)
    assert mp.scaler is None
    assert "train_config.grad_scaler is ignored" in caplog.text


def test_grad_scaler_under_fp16_is_used_without_warning(caplog):
    from hashrec.config.train_pb2 import GradScaler

    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        mp = MixedPrecision.create("FP16", torch.device("cpu"), GradScaler(init_scale=1024.0))
    assert mp.scaler.get_scale() == 1024.0
    assert "grad_scaler" not in caplog.text


@pytest.fixture
def tf32_switches():
    """Torch's TF32 switches, put back after the test."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("cudnn, matmul", [(False, True), (True, False)],
                         ids=["matmul-on", "cudnn-off-matmul-off"])
def test_tf32_switches_follow_train_config_on_a_gpu(tf32_switches, cudnn, matmul):
    from hashrec.config.train_pb2 import TrainConfig
    from hashrec.train.precision import apply_tf32

    torch.backends.cudnn.allow_tf32 = not cudnn
    torch.backends.cuda.matmul.allow_tf32 = not matmul
    apply_tf32(TrainConfig(cudnn_allow_tf32=cudnn, cuda_matmul_allow_tf32=matmul),
               torch.device("cuda", 0))
    assert torch.backends.cudnn.allow_tf32 is cudnn
    assert torch.backends.cuda.matmul.allow_tf32 is matmul


def test_tf32_switches_unset_or_on_the_cpu_stay_as_they_are(tf32_switches):
    from hashrec.config.train_pb2 import TrainConfig
    from hashrec.train.precision import apply_tf32

    torch.backends.cuda.matmul.allow_tf32 = True
    apply_tf32(TrainConfig(), torch.device("cuda", 0))  # unset: torch's setting stays
    apply_tf32(TrainConfig(cuda_matmul_allow_tf32=False), torch.device("cpu"))
    assert torch.backends.cuda.matmul.allow_tf32 is True


def _two_kinds(scaler_init: float):
    """An FP16 MixedPrecision on the CPU and an Adam and an SGD over a parameter each."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    optimizers = (torch.optim.Adam([a], lr=0.1), torch.optim.SGD([b], lr=0.5))
    precision = MixedPrecision.create("FP16", torch.device("cpu"))
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=scaler_init)
    return a, b, optimizers, precision


def _scaled_step(precision, optimizers, parameters, clip_norm=None):
    together = as_one_optimizer(optimizers)
    precision.unscale(together)
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
    precision.step(together)


def test_dense_optimizers_of_several_kinds_unscale_clip_and_step_together():
    """Unscaled, clipped by the norm over both, then each by its own rule, as hand-built
    optimizers on the true gradients."""
    a, b, optimizers, precision = _two_kinds(8.0)
    ha, hb = (torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2)))
    hand = (torch.optim.Adam([ha], lr=0.1), torch.optim.SGD([hb], lr=0.5))
    for _ in range(2):
        for p in (a, b, ha, hb):
            p.grad = None
        precision.backward((a * torch.tensor([1.0, 2.0, 3.0])).sum() + (b * 4.0).sum())
        ((ha * torch.tensor([1.0, 2.0, 3.0])).sum() + (hb * 4.0).sum()).backward()
        _scaled_step(precision, optimizers, [a, b], clip_norm=1.0)
        torch.nn.utils.clip_grad_norm_([ha, hb], 1.0)
        for optimizer in hand:
            optimizer.step()
    assert torch.allclose(a, ha) and torch.allclose(b, hb)
    assert not torch.equal(b, torch.ones(2))


def test_an_overflow_in_one_kinds_gradients_skips_every_kinds_step():
    """A NaN in the Adam parameter's gradient makes the clipped SGD gradient NaN too: both
    skip the step (scaled apart, the SGD one would step on NaN), and the scale backs off."""
    a, b, optimizers, precision = _two_kinds(8.0)
    precision.backward((a * torch.tensor([1.0, float("nan"), 1.0])).sum() + b.sum())
    _scaled_step(precision, optimizers, [a, b], clip_norm=1.0)
    assert torch.equal(a.detach(), torch.ones(3)) and torch.equal(b.detach(), torch.ones(2))
    assert precision.scaler.get_scale() == 4.0

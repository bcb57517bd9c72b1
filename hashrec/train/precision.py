"""Mixed precision: autocast for the dense network, a grad scaler for FP16.

Embedding lookups always run in float32 (the model switches autocast off
around them); ``mixed_precision`` only changes the dense network's compute
dtype.

FP16 needs loss scaling, but sparse updates are applied inside the backward
pass, before ``GradScaler.step`` could unscale anything. So under FP16 the
model's embedding outputs pass through ``unscale_in_backward``: an identity
whose backward divides the gradient by the current loss scale, so the fused
sparse optimizer sees true gradients. When that gradient is not finite (an
overflow the scaler will also see on the dense side and skip), it is replaced
by zeros: the sparse step of that batch is then a zero-gradient update (a no-op
for SGD and Adagrad; Adam's moments still decay one step).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace

import torch

from hashrec.train.errors import TrainError

logger = logging.getLogger("hashrec.train")

PRECISIONS = {"": None, "BF16": torch.bfloat16, "FP16": torch.float16}


def apply_tf32(train_config, device: torch.device) -> None:
    """Set torch's TF32 switches that ``train_config`` sets (``cudnn_allow_tf32``,
    ``cuda_matmul_allow_tf32``) on a GPU run, as TorchEasyRec does; an unset field
    leaves torch's own default (cuDNN on, matmul off: the fields' defaults too)."""
    if device.type != "cuda":
        return
    if train_config.HasField("cudnn_allow_tf32"):
        torch.backends.cudnn.allow_tf32 = train_config.cudnn_allow_tf32
    if train_config.HasField("cuda_matmul_allow_tf32"):
        torch.backends.cuda.matmul.allow_tf32 = train_config.cuda_matmul_allow_tf32


class _UnscaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, scaler) -> torch.Tensor:
        ctx.scaler = scaler
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scale = ctx.scaler.get_scale()
        grad = grad.float() / scale
        grad = torch.where(torch.isfinite(grad).all(), grad, torch.zeros_like(grad))
        return grad, None


def unscale_in_backward(tensor: torch.Tensor, scaler) -> torch.Tensor:
    """Identity forward; backward divides the gradient by ``scaler.get_scale()``."""
    return _UnscaleGrad.apply(tensor, scaler)


class Optimizers:
    """Several torch optimizers as one for the grad scaler: ``GradScaler.unscale_`` checks
    the gradients of all of them for infs at once, and ``GradScaler.step`` skips all of
    their steps or none. Scaled one by one, an optimizer whose own gradients are finite
    would step although clipping by the global norm had just made them NaN (one NaN
    gradient elsewhere makes the norm NaN).

    Its step reads the inf check on the host, as the scaler does for an optimizer without
    a step of its own that takes it (SGD, Adagrad).
    """

    def __init__(self, optimizers) -> None:
        self.optimizers = tuple(optimizers)

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


def as_one_optimizer(optimizers):
    """The one optimizer of ``optimizers`` (a sequence), or ``Optimizers`` over them."""
    return optimizers[0] if len(optimizers) == 1 else Optimizers(optimizers)


@dataclass
class MixedPrecision:
    """Autocast dtype and (FP16) grad scaler of one training run.

    Args:
        mode: ``""`` (float32), ``"BF16"`` or ``"FP16"``.
        device: the training device.
        scaler_config: optional ``GradScaler`` message (FP16 only).
    """

    mode: str
    device: torch.device
    scaler: torch.amp.GradScaler | None = None

    @classmethod
    def create(cls, mode: str, device: torch.device, scaler_config=None) -> MixedPrecision:
        key = (mode or "").upper()
        if key not in PRECISIONS:
            raise TrainError(f"train_config.mixed_precision={mode!r}; allowed: BF16, FP16 or "
                             f"empty")
        scaler = None
        if scaler_config is not None and key != "FP16":
            # TorchEasyRec scales whatever the precision; float32 and BF16 gradients
            # neither underflow nor gain from it here, so the setting goes unused: say so.
            logger.warning("train_config.grad_scaler is ignored: HashRec scales the loss only "
                           "under mixed_precision FP16 (this run: %s)", key or "float32")
        if key == "FP16":
            kwargs = {}
            if scaler_config is not None:
                kwargs = {f: getattr(scaler_config, f) for f in (
                    "init_scale", "growth_factor", "backoff_factor", "growth_interval")}
            scaler = torch.amp.GradScaler(device.type, **kwargs)
        return cls(key, device, scaler)

    @property
    def dtype(self) -> torch.dtype | None:
        return PRECISIONS[self.mode]

    def autocast(self):
        """Context for the forward pass (a no-op in float32 mode)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        # No weight-cast cache: each weight is used once per forward, and CUDA graph
        # captures of the dense network (hashrec.train.graphs) need it off.
        return torch.autocast(device_type=self.device.type, dtype=self.dtype,
                              cache_enabled=False)

    def embedding_hook(self):
        """Map applied to embedding outputs before the dense network (FP16 only)."""
        if self.scaler is None:
            return None
        scaler = self.scaler

        def hook(embedded):
            pooled = {k: unscale_in_backward(v, scaler) for k, v in embedded.pooled.items()}
            sequences = {k: (unscale_in_backward(v, scaler), lengths)
                         for k, (v, lengths) in embedded.sequences.items()}
            return replace(embedded, pooled=pooled, sequences=sequences)

        return hook

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer | Optimizers) -> None:
        """Unscale dense gradients before clipping (FP16); ``optimizer``: one torch
        optimizer, or ``Optimizers`` (the same object in ``step``)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer | Optimizers) -> None:
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

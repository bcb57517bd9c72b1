"""Backend choice shared by the op packages."""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

import torch


@functools.cache
def _triton_module(package: str) -> ModuleType | None:
    name = f"{package}.triton"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Only "triton is not installed" or "no kernel written for this op" fall back;
        # any other import failure inside the kernel module is a bug and propagates.
        if exc.name in ("triton", name):
            return None
        raise


@functools.cache
def _forced() -> bool:
    # HASHREC_FORCE_TRITON=1 with TRITON_INTERPRET=1 runs the Triton kernels on CPU
    # tensors, so the CUDA dispatch path can be exercised end to end without a GPU.
    return os.environ.get("HASHREC_FORCE_TRITON") == "1"


def backend(package: str, reference: ModuleType, device: torch.device) -> ModuleType:
    """Returns the op module for ``device``: ``<package>.triton`` on CUDA when importable."""
    if device.type == "cuda" or _forced():
        module = _triton_module(package)
        if module is not None:
            return module
    return reference

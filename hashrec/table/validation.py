"""Checks of user-supplied tensors; every failure is a ValueError naming table and field."""

from __future__ import annotations

import math
import os

import torch

from hashrec.table.errors import TableError


def input_checks_forced() -> bool:
    """``HASHREC_CHECK_INPUTS=1``: the table checks its inputs' values (unique keys,
    counts >= 1, slots below capacity) on every path, not only on the CPU reference
    path. Each check sorts or reads the device back, so lookups are then not captured
    as CUDA graphs either: for debugging, not for speed."""
    setting = os.environ.get("HASHREC_CHECK_INPUTS", "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"HASHREC_CHECK_INPUTS={setting!r}: expected 0 or 1")
    return setting == "1"


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"dtype={value.dtype} shape={tuple(value.shape)} device={value.device}"
    return f"{type(value).__name__}"


def concrete_device(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>`` and ``cpu:<n>`` -> ``cpu``, so that tensors made on
    it compare equal to it (a CPU tensor's device has no index)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu" and device.index is not None:
        return torch.device("cpu")
    return device


def check_vector(table: str, name: str, value: object, dtype: torch.dtype,
                 device: torch.device, length: int | None = None) -> torch.Tensor:
    """Returns ``value`` if it is a 1-D ``dtype`` tensor on ``device`` (of ``length``)."""
    ok = (isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1
          and value.device == device and (length is None or value.numel() == length))
    if not ok:
        want = f"a 1-D {dtype} tensor on {device}"
        if length is not None:
            want += f" of length {length}"
        raise ValueError(f"table {table!r}: {name} must be {want}, got {_describe(value)}")
    return value


def check_optional_vector(table: str, name: str, value: object, dtype: torch.dtype,
                          device: torch.device, length: int) -> torch.Tensor | None:
    """Like ``check_vector`` but None passes through."""
    if value is None:
        return None
    return check_vector(table, name, value, dtype, device, length)


def check_matrix(table: str, name: str, value: object, rows: int, cols: int,
                 device: torch.device) -> torch.Tensor:
    """Returns ``value``, detached, if it is a (rows, cols) floating tensor on ``device``
    (the table copies it in; storage never joins an autograd graph)."""
    ok = (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 2
          and tuple(value.shape) == (rows, cols) and value.device == device)
    if not ok:
        raise ValueError(f"table {table!r}: {name} must be a ({rows}, {cols}) float tensor on "
                         f"{device}, got {_describe(value)}")
    return value.detach()


def checked_lr(table: str, lr: object) -> float:
    ok = isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr)
    if not ok or lr < 0:
        raise ValueError(f"table {table!r}: lr={lr!r} is not valid; allowed: a finite "
                         f"number >= 0")
    return lr


def checked_step(table: str, step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"table {table!r}: step={step!r} is not valid; allowed: an int >= 1 "
                         f"(1-based, for Adam's bias correction)")
    return step


def build_device(options) -> torch.device:
    """``options.device`` made concrete; TableError when this torch cannot allocate on it."""
    device = options.device
    available = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if device.type == "cuda" and not torch.cuda.is_available():
        reason = "this torch build or machine has no CUDA device"
    elif device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        reason = f"only {torch.cuda.device_count()} CUDA devices are visible"
    elif device.type not in ("cpu", "cuda"):
        reason = "tables are stored on cpu or cuda devices only"
    else:
        return concrete_device(device)
    raise TableError(f"table {options.name!r}: device={str(device)!r} is not usable: {reason} "
                     f"(available: {', '.join(available)}); set TableOptions.device to one of "
                     f"them")

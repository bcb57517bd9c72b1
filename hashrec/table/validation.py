"""Checks of user-supplied tensors; every failure is a ValueError naming table and field."""

from __future__ import annotations

import torch


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"dtype={value.dtype} shape={tuple(value.shape)} device={value.device}"
    return f"{type(value).__name__}"


def concrete_device(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``, so that tensors made on it compare equal to it."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
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

"""An L2 persisting window over one device array, for benchmarks that try keeping a
table's digest array in the GPU's L2 cache (CUDA driver API through ctypes).

``persist(tensor)`` sets aside the device's largest persisting L2 share (or a fraction of
it) and marks accesses to ``tensor`` on the current stream persisting (as many of its
lines as the share holds, the rest streaming); ``clear()`` undoes both.
"""

from __future__ import annotations

import ctypes
import functools

import torch

_MAX_PERSISTING_L2 = 108  # CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
_MAX_WINDOW = 109  # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE
_LIMIT_PERSISTING_L2 = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
_ACCESS_POLICY_WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
_STREAMING, _PERSISTING = 1, 2  # CUaccessProperty


class _Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hit_ratio", ctypes.c_float), ("hit_prop", ctypes.c_int),
                ("miss_prop", ctypes.c_int)]


class _Value(ctypes.Union):  # CUstreamAttrValue: a 64-byte union
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 64)]


@functools.cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.cuStreamSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Value)]
    lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    lib.cuCtxResetPersistingL2Cache.argtypes = []
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed with CUresult {result}")


def _attribute(lib, attribute: int, device: int) -> int:
    value = ctypes.c_int()
    _check(lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device), "cuDeviceGetAttribute")
    return value.value


def persist(tensor: torch.Tensor, fraction: float = 1.0) -> dict:
    """Marks ``tensor``'s accesses on the current stream persisting in L2, in ``fraction`` of
    the device's largest persisting share; returns what was set (the persisting share, the
    window's bytes and its hit ratio)."""
    lib = _driver()
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    share = int(_attribute(lib, _MAX_PERSISTING_L2, device) * fraction)
    window_max = _attribute(lib, _MAX_WINDOW, device)
    _check(lib.cuCtxSetLimit(_LIMIT_PERSISTING_L2, share), "cuCtxSetLimit")
    nbytes = min(tensor.numel() * tensor.element_size(), window_max)
    value = _Value()
    value.window = _Window(tensor.data_ptr(), nbytes, min(1.0, share / nbytes), _PERSISTING,
                           _STREAMING)
    stream = torch.cuda.current_stream(tensor.device).cuda_stream
    _check(lib.cuStreamSetAttribute(stream, _ACCESS_POLICY_WINDOW, ctypes.byref(value)),
           "cuStreamSetAttribute")
    return {"persisting_bytes": share, "window_bytes": nbytes,
            "hit_ratio": value.window.hit_ratio,
            "l2_bytes": torch.cuda.get_device_properties(device).L2_cache_size}


def clear() -> None:
    """Removes the current stream's window and the persisting lines."""
    lib = _driver()
    value = _Value()
    stream = torch.cuda.current_stream().cuda_stream
    _check(lib.cuStreamSetAttribute(stream, _ACCESS_POLICY_WINDOW, ctypes.byref(value)),
           "cuStreamSetAttribute")
    _check(lib.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")

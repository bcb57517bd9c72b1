"""Triton launches without Triton's per-call binding, once a specialization is compiled.

``kernel[grid](*args, **constexprs)`` binds the arguments, computes Triton's
specialization and cache key, stringifies the options and checks globals on
every call: 13-23 us of host time per launch on an H200 host
(``benchmarks/results/launch_gpu.md``), against 5-9 us for the compiled kernel's
launcher alone. A training step of a dynamic table makes dozens of launches, and
the step is host-bound, so ``@fast_launch`` on a ``@triton.jit`` kernel keeps
the compiled kernel of each specialization and calls its launcher directly.

The specialization key is computed here, at least as finely as Triton's: each
tensor argument's dtype and 16-byte alignment, each integer's value class
(equal to 1, divisible by 16, 32-bit / 64-bit / unsigned range), a float's type,
any other positional argument's value (None, bools), and every keyword argument's
value (constexprs and launch options), and the value of a constexpr passed by
position. Equal keys therefore mean the same compiled kernel. The first launch of
a key goes through ``kernel[grid]``, which compiles and returns the kernel; so do
launches this path does not cover: the interpreter (``TRITON_INTERPRET=1``), a
callable grid, unhashable or tensor keyword arguments, and launch hooks
(profilers) being set. The fast path passes no launch metadata and no hooks to
the launcher.
"""

from __future__ import annotations

import inspect
import os

import torch
from torch import Tensor
from triton import knobs

_INT32 = 1 << 31
_INT64 = 1 << 63
_RUNTIME = knobs.runtime


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host code: a plain function (Triton's costs microseconds a call)."""
    return -(-a // b)


def aligned_rows(count: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialized (count, n) array whose rows each start 16-byte aligned whatever n
    (its row stride is n rounded up): Triton compiles a kernel once per pointer alignment
    (16 bytes or not), so work arrays cut from one buffer at multiples of n would compile
    a second variant of every kernel they reach whenever n is not a multiple of 16
    bytes. ``.unbind(0)`` gives the rows."""
    per = 16 // dtype.itemsize
    return torch.empty(count, cdiv(n, per) * per, dtype=dtype, device=device)[:, :n]


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (0 for 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def maxnreg(regs: int) -> dict:
    """Launch options capping a kernel's registers a thread at ``regs`` (none for 0)."""
    return {"maxnreg": regs} if regs else {}


def env_int(name: str, default: int) -> int:
    """An integer kernel setting from the environment variable ``name``."""
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _hooked(hook) -> bool:
    """Whether a launch hook is set (Triton keeps an empty chain of them when none is)."""
    return bool(getattr(hook, "calls", hook))


class _Compiled:
    """A compiled kernel with what its launcher needs besides the launch's own arguments."""

    __slots__ = ("run", "function", "metadata", "tail")

    def __init__(self, compiled, tail: tuple) -> None:
        self.run = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.tail = tail  # the parameters after the positional ones, in signature order


class FastKernel:
    """A ``@triton.jit`` kernel launched as ``kernel[grid](*args, **kwargs)``, with the
    launcher called directly once the specialization is compiled (module docstring)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._compiled: dict[tuple, _Compiled] = {}
        names = getattr(kernel, "arg_names", None)
        # The interpreter's kernels (TRITON_INTERPRET=1) have no compiled launcher.
        self._enabled = names is not None and hasattr(kernel, "device_caches")
        if self._enabled:
            params = inspect.signature(kernel.fn).parameters
            self._names = list(names)
            # Constexprs passed by position specialize on their value.
            self._constexpr_at = [i for i, p in enumerate(kernel.params) if p.is_constexpr]
            self._defaults = {name: p.default for name, p in params.items()
                              if p.default is not inspect.Parameter.empty}

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        """``kernel[grid](*args, **kwargs)``."""
        if not self._enabled or _hooked(_RUNTIME.launch_enter_hook) \
                or _hooked(_RUNTIME.launch_exit_hook) or callable(grid):
            return self.kernel[grid](*args, **kwargs)
        device = _current_device()
        # Tensors: dtype and 16-byte alignment; ints: == 1, divisible by 16, 32-bit, below
        # 2 ** 63; floats: the type (Triton passes them unspecialized); anything else
        # (None, bools): the value.
        key = [(a.dtype, a.data_ptr() & 15 == 0) if isinstance(a, Tensor) else
               (a == 1, a & 15 == 0, -_INT32 <= a < _INT32, a < _INT64) if a.__class__ is int
               else float if a.__class__ is float else a for a in args]
        if self._constexpr_at:
            key += [args[i] for i in self._constexpr_at if i < len(args)]
        try:
            entry = self._compiled.get((device, *kwargs.items(), *key))
        except TypeError:  # an unhashable keyword argument
            return self.kernel[grid](*args, **kwargs)
        if entry is None:
            return self._compile((device, *kwargs.items(), *key), grid, args, kwargs)
        g1 = g2 = 1
        if len(grid) > 1:
            g1 = grid[1]
            if len(grid) > 2:
                g2 = grid[2]
        if not grid[0] * g1 * g2:
            return None
        entry.run(grid[0], g1, g2, _current_stream(device), entry.function, entry.metadata,
                  None, None, None, *args, *entry.tail)
        return None

    def _compile(self, key: tuple, grid, args: tuple, kwargs: dict):
        compiled = self.kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):  # an asynchronous compile
            compiled = compiled.result()
        rest = self._names[len(args):]
        if compiled is None or any(isinstance(kwargs.get(n), torch.Tensor) for n in rest):
            return compiled
        missing = [n for n in rest if n not in kwargs and n not in self._defaults]
        if missing:  # Triton would have raised; keep its error path
            return compiled
        tail = tuple(kwargs[n] if n in kwargs else self._defaults[n] for n in rest)
        self._compiled[key] = _Compiled(compiled, tail)
        return compiled


def fast_launch(kernel) -> FastKernel:
    """Decorator for a ``@triton.jit`` kernel that is launched from the host."""
    return FastKernel(kernel)

"""``interpreter_patch_once``: an interpreted launch patches triton.language once, and its
kernel computes what it computed with a patch per helper call."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed")
import interpreter_patch_once  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="kernels run compiled, not interpreted")


@triton.jit
def _scaled(x, scale):
    return x * scale


@triton.jit
def _clamped(x, high):
    return tl.minimum(_scaled(x, 2.0), high)


@triton.jit
def _kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask)
    tl.store(dst + offs, _clamped(_scaled(x, 0.5), 3.0) + tl.sum(x, 0) * 0, mask=mask)


def test_a_launch_patches_the_language_once_and_computes_the_same(monkeypatch):
    assert interpreter_patch_once.install()
    patches = []
    patch = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patches.append(fn) or patch(fn))
    src = torch.arange(-10, 27, dtype=torch.float32)
    dst = torch.empty_like(src)
    _kernel[(5,)](src, dst, src.numel(), BLOCK=8)  # 5 programs, 3 helper calls each
    # The kernel's modules once, and a helper's only where the kernel's do not cover them
    # (tl.sum's module sees triton.language.core alone): never once a program.
    assert patches[0].__name__ == "_kernel" and len(patches) == len(set(patches)) < 5
    assert torch.equal(dst, torch.clamp(src, max=3.0))
    # The language is restored after the launch: a helper called outside a kernel fails.
    with pytest.raises(Exception):  # noqa: B017 - Triton's own error type varies
        tl.minimum(1, 2)

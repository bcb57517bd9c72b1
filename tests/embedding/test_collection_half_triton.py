"""Tables storing float16 / bfloat16 rows: the Triton path against the reference path.

On a CPU-only machine the Triton kernels run under ``TRITON_INTERPRET=1``, selected by
``HASHREC_FORCE_TRITON=1``; on CUDA (``gpu`` marker) the compiled kernels run against
the CPU reference. Both paths load half rows, compute in float32 and store rounded, so
from the same rows they store:

* float16: the same values. The interpreter converts float32 to float16 with rounding to
  nearest even, as PyTorch does, and the float32 gradients differ only in the order of
  their sums, far below a float16 step, so the stored values agree bit for bit.
* bfloat16: values at most one bfloat16 ulp apart. The interpreter converts float32 to
  bfloat16 by truncation (toward zero), where PyTorch and the compiled kernels round to
  nearest even.

On CUDA both dtypes are held to one ulp: ``tl.sqrt`` and division are the fast float32
forms there, whose last bit may differ from PyTorch's and tip a rounding.

Several steps are not compared: a one-ulp difference changes the next step's gradients.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

import half_tables as ht  # noqa: E402
from half_precision import ulps  # noqa: E402
from host_reads import forced_triton  # noqa: E402

# Stored values of the Triton path may differ from the reference's by this many ulps.
INTERPRETED_ULPS = {torch.float16: 0, torch.bfloat16: 1}
COMPILED_ULPS = {torch.float16: 1, torch.bfloat16: 1}


@pytest.fixture
def small_chunks(monkeypatch):
    """Gradient sums over 16 positions a program: the interpreter pads none of this test's
    few positions to the default 64."""
    from hashrec.embedding.ops.fused import triton as fused

    monkeypatch.setattr(fused, "REDUCE_CONFIG", {"rows": 16, "num_warps": 1})


def _step(collection, kjt):
    """One training step with the rows' gradient fixed; -> the pooled outputs."""
    out = collection(kjt)
    ht.linear_loss(out).backward()
    return {name: t.detach().cpu() for name, t in out.pooled.items()}


def _compare(got: dict, want: dict, dtype: torch.dtype, allowed: int) -> None:
    for name, rows in want.items():
        assert got[name].dtype == dtype and got[name].shape == rows.shape, name
        assert ulps(got[name], rows) <= allowed, name


def _one_step(optimizer, dtype, make_kjt, device: str, context=contextlib.nullcontext):
    """One step of each path from the same rows: -> (the Triton path's rows, the
    reference's). ``context`` selects the Triton path on the CPU (the preloads before it
    take the reference ops, whose table layout is the same, and are quicker)."""
    rows = ht.start_rows(optimizer, dtype)
    reference = ht.half_collection(dtype, optimizer)
    triton_path = ht.half_collection(dtype, optimizer, device)
    for collection in (reference, triton_path):
        ht.preload(collection, rows)
    want_out = _step(reference, ht.batch(make_kjt, 0))
    with context():
        got_out = _step(triton_path, ht.batch(make_kjt, 0, device))
    for name, value in want_out.items():
        assert got_out[name].dtype == torch.float32
        torch.testing.assert_close(got_out[name], value, rtol=1e-5, atol=1e-6, msg=name)
    return ht.table_rows(triton_path), ht.table_rows(reference)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu tests below cover CUDA")
@pytest.mark.parametrize("dtype", ht.HALF.values(), ids=ht.HALF.keys())
@pytest.mark.parametrize("optimizer", ht.OPTIMIZERS.values(), ids=ht.OPTIMIZERS.keys())
def test_one_step_stores_what_the_reference_stores(optimizer, dtype, make_kjt, small_chunks):
    got, want = _one_step(optimizer, dtype, make_kjt, "cpu", forced_triton)
    _compare(got, want, dtype, INTERPRETED_ULPS[dtype])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu tests below cover CUDA")
@pytest.mark.parametrize("dtype", ht.HALF.values(), ids=ht.HALF.keys())
def test_new_rows_start_as_on_the_reference(dtype, make_kjt):
    reference = ht.half_collection(dtype, ht.OPTIMIZERS["adagrad"])
    with torch.no_grad():
        reference(ht.batch(make_kjt, 1))
    with forced_triton():
        triton_path = ht.half_collection(dtype, ht.OPTIMIZERS["adagrad"])
        with torch.no_grad():
            triton_path(ht.batch(make_kjt, 1))
        got = ht.table_rows(triton_path)
    _compare(got, ht.table_rows(reference), dtype, INTERPRETED_ULPS[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ht.HALF.values(), ids=ht.HALF.keys())
@pytest.mark.parametrize("optimizer", ht.OPTIMIZERS.values(), ids=ht.OPTIMIZERS.keys())
def test_one_step_on_cuda_stores_what_the_cpu_stores(optimizer, dtype, make_kjt):
    got, want = _one_step(optimizer, dtype, make_kjt, "cuda")
    _compare(got, want, dtype, COMPILED_ULPS[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ht.HALF.values(), ids=ht.HALF.keys())
def test_new_rows_on_cuda_start_as_on_the_cpu(dtype, make_kjt):
    collections = {d: ht.half_collection(dtype, ht.OPTIMIZERS["adagrad"], d)
                   for d in ("cpu", "cuda")}
    with torch.no_grad():
        for device, collection in collections.items():
            collection(ht.batch(make_kjt, 1, device))
    _compare(ht.table_rows(collections["cuda"]), ht.table_rows(collections["cpu"]), dtype,
             COMPILED_ULPS[dtype])

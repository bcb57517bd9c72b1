"""The collection through every Triton op (the CUDA dispatch path) equals the reference path.

On a CPU-only machine the Triton kernels run under ``TRITON_INTERPRET=1`` on CPU
tensors, selected by ``HASHREC_FORCE_TRITON=1``; this catches kernel bugs that
only show when the ops are composed (fused tables, growth, eviction, updates).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from test_collection_gpu import FEATURES, NUM_IDS, _collection  # noqa: E402

from hashrec.table.ops import dispatch  # noqa: E402


def _train(make_kjt, force: bool) -> list[dict[str, torch.Tensor]]:
    dispatch._forced.cache_clear()
    os.environ["HASHREC_FORCE_TRITON"] = "1" if force else "0"
    try:
        collection, outputs = _collection("cpu"), []
        for step in range(3):
            kjt = make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=step, weighted=True)
            out = collection(kjt)
            outputs.append({k: v.detach().clone() for k, v in out.pooled.items()})
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            (loss + out.sequences["h"][0].sum()).backward()
        return outputs
    finally:
        os.environ.pop("HASHREC_FORCE_TRITON", None)
        dispatch._forced.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="covered by test_collection_gpu on CUDA")
def test_triton_ops_train_like_reference(make_kjt):
    reference, triton_path = _train(make_kjt, False), _train(make_kjt, True)
    for step, (want, got) in enumerate(zip(reference, triton_path)):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5,
                                       msg=f"step {step} feature {name}")

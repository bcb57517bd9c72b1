"""Sharded training compiles each kernel's variants in its first step too: two gloo ranks
train ``test_sharded_collection``'s tables (two dynamic storages, one with admission, and
a dense table) with their Triton kernels interpreted (``HASHREC_FORCE_TRITON``); batches
whose sizes change from step to step reach no variant that differs from an earlier one
only in alignment or divisibility by 16 (``tests.kernel_variants``), on either rank."""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch
from dist_workers import run_world
from test_sharded_collection import FEATURES, _collection, _head

from hashrec.embedding import KeyedJaggedTensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernel_variants import ALLOWED, LaunchLog, late_variants_of  # noqa: E402

# Rows per rank and step: counts not divisible by 16, then divisible, then a short batch.
ROWS = [7, 16, 5]


def _kjt(step: int, rank: int, rows: int) -> KeyedJaggedTensor:
    """Distinct ids in every dynamic feature (fresh each step and rank), two categories."""
    base = 100_000 * step + 10_000 * rank
    hot = torch.arange(rows) + base
    adm = torch.arange(rows) + base + 5_000
    cat = torch.stack([torch.arange(rows) % 20, (torch.arange(rows) + 3) % 20], 1).flatten()
    lengths = torch.cat([torch.ones(2 * rows), torch.full((rows,), 2)]).long()
    return KeyedJaggedTensor.from_lengths(list(FEATURES), torch.cat([hot, adm, cat]), lengths)


def _scenario(ctx, out_dir: str) -> set[int]:
    log = LaunchLog(os.path.join(out_dir, f"launches{ctx.rank}.jsonl"))
    collection, head = _collection(ctx), _head()
    for log.step, rows in enumerate(ROWS):
        out = collection(_kjt(log.step, ctx.rank, rows))
        x = torch.cat([out.pooled[name] for name in FEATURES], 1)
        head(x).square().sum().backward()
    return log.write()


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches run compiled on CUDA")
def test_sharded_steps_after_the_first_compile_no_variant_for_alignment_or_sizes(tmp_path):
    env = {"HASHREC_FORCE_TRITON": "1", "TRITON_INTERPRET": "1"}
    worlds = run_world({"train": functools.partial(_scenario, out_dir=str(tmp_path))}, 2,
                       tmp_path, env)
    for result in worlds["train"]:
        if isinstance(result, Exception):
            raise result
        assert result == {0, 1, 2}
    logs = [tmp_path / f"launches{rank}.jsonl" for rank in range(2)]
    assert late_variants_of(logs, ALLOWED) == []

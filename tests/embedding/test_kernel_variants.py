"""Training compiles each kernel's variants in its first step: later batches, whatever
their sizes and wherever a joined storage's keys start, reach no variant that differs
from an earlier one only in a pointer's 16-byte alignment or an integer's divisibility
by 16, each of which Triton compiles anew (a stall of up to seconds per kernel,
mid-training, on a fresh kernel cache).

The collection runs its Triton kernels under the interpreter (``HASHREC_FORCE_TRITON``),
every launch logged with its step; a process without the interpreter then gives each
launch the specialization the GPU launcher would (``tests.kernel_variants``).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.embedding import (  # noqa: E402
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import (  # noqa: E402
    AdmissionOptions,
    InitializerArgs,
    SparseAdagrad,
    TableOptions,
)
from hashrec.table.ops import dispatch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernel_variants import ALLOWED, LaunchLog, late_variants_of  # noqa: E402

DIM = 4
FEATURES = [EmbeddingFeatureSpec("user", "user_t"), EmbeddingFeatureSpec("item", "item_t"),
            EmbeddingFeatureSpec("hist", "item_t", is_sequence=True, max_length=2),
            EmbeddingFeatureSpec("cat", "cat_t", weighted=True)]


def _collection() -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3)
    tables = [
        EmbeddingTableSpec("user_t", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=256, bucket_capacity=16, initializer=init,
            admission=AdmissionOptions(threshold=2, counter_capacity=256,
                                       counter_bucket_capacity=16))),
        EmbeddingTableSpec("item_t", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=256, bucket_capacity=16, initializer=init)),
        EmbeddingTableSpec("cat_t", DIM, num_rows=50, initializer=init),
    ]
    torch.manual_seed(0)
    return EmbeddingCollection(tables, FEATURES, SparseAdagrad(lr=0.05), "cpu")


def _batch(step: int, users: int, items: int) -> KeyedJaggedTensor:
    """``users`` samples of distinct users, items and categories, and two history items
    each; ``items`` distinct ones among the items and history together."""
    base = 1000 * step
    user = torch.arange(users) + base
    item = torch.arange(users) + base
    hist = (torch.arange(2 * users) % max(1, items - users)) + base + 500
    cat = torch.arange(users) % 50
    lengths = torch.cat([torch.ones(users), torch.ones(users), torch.full((users,), 2),
                         torch.ones(users)]).long()
    values = torch.cat([user, item, hist, cat])
    weights = torch.rand(values.numel(), generator=torch.Generator().manual_seed(step))
    return KeyedJaggedTensor.from_lengths([f.name for f in FEATURES], values, lengths,
                                          weights)


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches run compiled on CUDA")
def test_later_steps_compile_no_variant_for_alignment_or_sizes(tmp_path, monkeypatch):
    # Step 0: 7 users (the item table's keys start 7 keys into the join's: unaligned) and
    # counts not divisible by 16; step 1: 16 users and 32 items (aligned, divisible);
    # then a short batch.
    shapes = [(7, 12), (16, 32), (5, 9)]
    log = LaunchLog(str(tmp_path / "launches.jsonl"), monkeypatch)
    monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    try:
        collection = _collection()
        for log.step, (users, items) in enumerate(shapes):
            out = collection(_batch(log.step, users, items))
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            (loss + out.sequences["hist"][0].sum()).backward()
    finally:
        dispatch._forced.cache_clear()
    assert log.write() == {0, 1, 2}
    assert late_variants_of([log.path], ALLOWED) == []

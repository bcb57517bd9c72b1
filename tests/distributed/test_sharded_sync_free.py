"""The sharded training step on the fixed-size path reads nothing back on the host.

Two gloo ranks run the Triton ops in the interpreter (the path CUDA takes): a
collection with a tagged fused pair of dynamic tables (one with admission) at
full capacity, and two grouped dense tables. After warm-up, a forward (the next
batch's dedup started ahead, as the trainer does) and a backward must dispatch
no operator whose result the host reads (``nonzero``, ``item``, ``unique``, a
boolean-mask index), and training must match the reference path's losses.
"""

from __future__ import annotations

import collections

import torch
from dist_workers import run_world
from host_reads import HostReads, interpreted_triton

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import AdmissionOptions, InitializerArgs, SparseAdam, TableOptions

WORLD, ROWS, STEPS, DIM = 2, 8, 5, 4
FEATURES = ("a", "b", "d1", "d2")
def _collection(ctx=None) -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=7)
    full = dict(dim=DIM, max_capacity=256, init_capacity=256, bucket_capacity=32,
                initializer=init, check_mode="IGNORE", score_strategy="LFU")
    tables = [
        EmbeddingTableSpec("ta", DIM, fusion_group="g", dynamic=TableOptions(**full)),
        EmbeddingTableSpec("tb", DIM, fusion_group="g", dynamic=TableOptions(
            **full, admission=AdmissionOptions(threshold=2, counter_capacity=512))),
        EmbeddingTableSpec("t1", DIM, num_rows=30, initializer=init),
        EmbeddingTableSpec("t2", DIM, num_rows=30, initializer=init),
    ]
    features = [EmbeddingFeatureSpec("a", "ta"), EmbeddingFeatureSpec("b", "tb"),
                EmbeddingFeatureSpec("d1", "t1"), EmbeddingFeatureSpec("d2", "t2")]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.05), "cpu", dist=ctx)


def _kjt(step: int, rank: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    values, lengths = [], []
    for name in FEATURES:
        high = 30 if name.startswith("d") else 400
        for _ in range(ROWS):
            bag = torch.randint(0, high, (2,), generator=g).tolist()
            values += bag
            lengths.append(len(bag))
    return KeyedJaggedTensor.from_lengths(list(FEATURES), torch.tensor(values),
                                          torch.tensor(lengths))


def scenario_steps(ctx):
    collection = _collection(ctx)
    batches = [_kjt(step, ctx.rank) for step in range(STEPS + 1)]
    losses, reads = [], collections.Counter()
    for step in range(STEPS):
        counter = HostReads()
        with counter:
            out = collection(batches[step])
            collection.prepare(batches[step + 1])
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            loss.backward()
        if step >= 2:  # after warm-up
            reads.update(counter.counts)
        losses.append(float(loss.detach()))
    return {"losses": losses, "reads": dict(reads)}


def _run(out_dir, fixed: bool):
    out_dir.mkdir()
    with interpreted_triton(fixed):
        ranks = run_world({"steps": scenario_steps}, WORLD, out_dir)["steps"]
    for r in ranks:
        if isinstance(r, Exception):
            raise r
    return ranks


def test_fixed_path_step_reads_nothing_and_trains_like_the_reference(tmp_path):
    fixed = _run(tmp_path / "fixed", True)
    reference = _run(tmp_path / "reference", False)
    for got, want in zip(fixed, reference):
        assert got["reads"] == {}, got["reads"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]),
                                   rtol=1e-4, atol=1e-5)
    assert any(r["reads"] for r in reference)  # the reference path does read back

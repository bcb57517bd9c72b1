"""The sharded training step on the fixed-size path reads nothing back on the host.

Two gloo ranks run the Triton ops in the interpreter (the path CUDA takes): a
collection with a tagged fused pair of dynamic tables (one with admission) at
full capacity, and two grouped dense tables. After warm-up, a forward (the next
batch's dedup started ahead, as the trainer does) and a backward must dispatch
no operator whose result the host reads (``nonzero``, ``item``, ``unique``, a
boolean-mask index), and training must match the reference path's losses.

The ranks share a prepared batch's dedup sizes ahead, so its step runs no size
exchange of its own; when one rank's sizes are not final (an id too wide for the
one-pass sort) every rank falls back to exchanging sizes for that step alike.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
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
def _collection(ctx=None, admission: bool = True) -> EmbeddingCollection:
    """Without ``admission`` the two dynamic tables share one storage (tags 0 and 1)."""
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=7)
    full = dict(dim=DIM, max_capacity=256, init_capacity=256, bucket_capacity=32,
                initializer=init, check_mode="IGNORE", score_strategy="LFU")
    tables = [
        EmbeddingTableSpec("ta", DIM, fusion_group="g", dynamic=TableOptions(**full)),
        EmbeddingTableSpec("tb", DIM, fusion_group="g", dynamic=TableOptions(
            **full, admission=AdmissionOptions(threshold=2, counter_capacity=512)
            if admission else None)),
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


@contextlib.contextmanager
def _size_exchanges(counts: collections.Counter):
    """Counts the calls that exchange sizes (the lookups' and the dense gradients')."""
    from hashrec.distributed import data_parallel, multi_lookup

    patched = [(multi_lookup, "exchange_host_splits"), (multi_lookup, "exchange_splits"),
               (data_parallel, "all_gather_ints")]
    originals = [getattr(module, name) for module, name in patched]

    def counting(name, fn):
        def call(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return call

    for (module, name), fn in zip(patched, originals):
        setattr(module, name, counting(name, fn))
    try:
        yield
    finally:
        for (module, name), fn in zip(patched, originals):
            setattr(module, name, fn)


def _train(ctx, batches, admission: bool = True):
    """Steps as the trainer runs them (the next batch prepared ahead): losses, host reads
    after warm-up, size exchanges per step."""
    collection = _collection(ctx, admission)
    losses, reads, exchanges = [], collections.Counter(), []
    for step in range(len(batches) - 1):
        counter, sizes = HostReads(), collections.Counter()
        with counter, _size_exchanges(sizes):
            out = collection(batches[step])
            collection.prepare(batches[step + 1])
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            loss.backward()
        if step >= 2:  # after warm-up
            reads.update(counter.counts)
        losses.append(float(loss.detach()))
        exchanges.append(sum(sizes.values()))
    return {"losses": losses, "reads": dict(reads), "exchanges": exchanges}


def scenario_steps(ctx):
    return _train(ctx, [_kjt(step, ctx.rank) for step in range(STEPS + 1)])


def scenario_wide(ctx):
    """Rank 0 reads key -1 of the fused storage from step 2 on: too wide for the one-pass
    sort of its two tables at step 2 (its sizes are not final), then sorted in two
    passes, whose lows read -1 for real."""
    batches = [_kjt(step, ctx.rank) for step in range(STEPS + 2)]
    if ctx.rank == 0:
        for kjt in batches[2:]:
            kjt.values()[0] = -1  # feature "a", the first id
    return _train(ctx, batches, admission=False)


def _run(out_dir, fixed: bool, scenario=scenario_steps):
    out_dir.mkdir()
    with interpreted_triton(fixed):
        ranks = run_world({"steps": scenario}, WORLD, out_dir)["steps"]
    for r in ranks:
        if isinstance(r, Exception):
            raise r
    return ranks


@pytest.fixture(scope="module")
def fixed_steps(tmp_path_factory):
    """The steps on the fixed-size path, run once for the tests that read them."""
    return _run(tmp_path_factory.mktemp("steps") / "fixed", True)


def test_fixed_path_step_reads_nothing_and_trains_like_the_reference(fixed_steps, tmp_path):
    reference = _run(tmp_path / "reference", False)
    for got, want in zip(fixed_steps, reference):
        assert got["reads"] == {}, got["reads"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]),
                                   rtol=1e-4, atol=1e-5)
    assert any(r["reads"] for r in reference)  # the reference path does read back


def test_prepared_steps_share_sizes_ahead(fixed_steps):
    for r in fixed_steps:
        # The first step's batch was not prepared; every later one was.
        assert r["exchanges"][0] > 0 and r["exchanges"][1:] == [0] * (STEPS - 1), r["exchanges"]


def test_a_rank_whose_sizes_are_not_final_makes_every_rank_exchange_sizes(tmp_path):
    fixed = _run(tmp_path / "fixed", True, scenario_wide)
    reference = _run(tmp_path / "reference", False, scenario_wide)
    for got, want in zip(fixed, reference):
        # Step 2: rank 0 sorted again; both ranks exchange sizes. Later steps: rank 0's
        # two-pass lows of -1 are real and both ranks use the shared sizes again.
        assert got["exchanges"][2] > 0 and got["exchanges"][3:] == [0] * (STEPS - 2), \
            got["exchanges"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]),
                                   rtol=1e-4, atol=1e-5)

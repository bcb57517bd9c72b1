"""Row-wise sharded lookup + sparse update on 2 gloo ranks vs single-process tables.

Every rank draws its own batches (duplicates within and across ranks, negative
keys included). The references run in each worker on the global batch (the
union of both ranks' batches), which every rank can regenerate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch
from dist_workers import run_world
from host_reads import interpreted_triton

from hashrec.distributed.all_to_all import all_to_all, exchange_splits
from hashrec.distributed.sharded_lookup import ShardedTable, unique_pairs
from hashrec.table import (
    AdmissionOptions,
    InitializerArgs,
    SparseAdam,
    SparseSGD,
    TableError,
    TableOptions,
)
from hashrec.table.hash_table import HashTable
from hashrec.table.hashing import owner_of
from hashrec.table.ops import dispatch

WORLD = 2
STEPS = 3
DIM = 4


def _options(optimizer, max_capacity, score_strategy="STEP", bucket_capacity=8):
    return TableOptions(
        dim=DIM, max_capacity=max_capacity, bucket_capacity=bucket_capacity,
        score_strategy=score_strategy, check_mode="IGNORE",
        initializer=InitializerArgs(mode="NORMAL", key_seed=11),
        admission=AdmissionOptions(threshold=2, counter_capacity=4096),
        optimizer=optimizer)


def _local_batch(step: int, rank: int, with_tags: bool = False):
    """(unique keys, tags | None, counts) of one rank's batch at one step."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    keys = torch.randint(-150, 150, (90,), generator=gen, dtype=torch.int64)
    tags = torch.randint(0, 2, (90,), generator=gen, dtype=torch.int32) if with_tags else None
    unique_keys, unique_tags, inverse = unique_pairs(keys, tags)
    counts = torch.zeros_like(unique_keys).index_add_(0, inverse, torch.ones_like(keys))
    return unique_keys, unique_tags, counts


def _global_batch(step: int, with_tags: bool = False):
    """The union of every rank's batch: unique keys, tags, summed counts."""
    parts = [_local_batch(step, r, with_tags) for r in range(WORLD)]
    keys = torch.cat([p[0] for p in parts])
    tags = torch.cat([p[1] for p in parts]) if with_tags else None
    counts = torch.cat([p[2] for p in parts])
    unique_keys, unique_tags, inverse = unique_pairs(keys, tags)
    summed = torch.zeros_like(unique_keys).index_add_(0, inverse, counts)
    return unique_keys, unique_tags, summed


def _grads(keys: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Sum-pooled gradient of each key: exact binary fractions, so sums are exact."""
    cols = torch.arange(DIM, dtype=torch.int64)
    per_use = (((keys[:, None] + cols[None, :]) % 13) - 6).to(torch.float32) / 16
    return per_use * counts[:, None].to(torch.float32)


@contextlib.contextmanager
def _plain_ops():
    """The ops on the PyTorch path, also in a world whose ranks interpret the Triton
    kernels: the references are the plain path, the shards what is checked against it
    (and the interpreter's time goes to the shards alone)."""
    forced = os.environ.pop("HASHREC_FORCE_TRITON", None)
    dispatch._forced.cache_clear()
    try:
        yield
    finally:
        if forced is not None:
            os.environ["HASHREC_FORCE_TRITON"] = forced
        dispatch._forced.cache_clear()


def _train_reference(table: HashTable, keys, tags, counts) -> torch.Tensor:
    with _plain_ops():
        table.advance_step()
        result = table.lookup(keys, tags, train=True, counts=counts)
        stored = result.slots >= 0
        table.apply_gradients(result.slots[stored], _grads(keys, counts)[stored])
        return result.values


def _rows(table: HashTable) -> dict[tuple[int, int], list[float]]:
    out = {}
    for keys, tags, rows, _scores in table.export_state(1024):
        for k, t, r in zip(keys.tolist(), tags.tolist(), rows.tolist()):
            out[(k, t)] = r
    return out


def _pick(keys, tags, ref_keys, ref_tags, ref_values):
    """Reference values at (keys, tags)."""
    index = {(k, 0 if ref_tags is None else t): i for i, (k, t) in enumerate(
        zip(ref_keys.tolist(), (ref_tags if ref_tags is not None else ref_keys).tolist()))}
    tag_list = tags.tolist() if tags is not None else [0] * len(keys)
    return ref_values[[index[(k, t)] for k, t in zip(keys.tolist(), tag_list)]]


def _run_against_single_table(ctx, optimizer, with_tags=False, use_autograd=False):
    """Large tables (no eviction pressure): shards together must equal one table."""
    options = _options(optimizer, max_capacity=4096, bucket_capacity=64)
    sharded = ShardedTable(HashTable(options), ctx)
    reference = HashTable(options)
    max_error = 0.0
    for step in range(STEPS):
        keys, tags, counts = _local_batch(step, ctx.rank, with_tags)
        g_keys, g_tags, g_counts = _global_batch(step, with_tags)
        expected = _pick(keys, tags, g_keys, g_tags,
                         _train_reference(reference, g_keys, g_tags, g_counts))
        sharded.table.advance_step()
        if use_autograd:
            values = sharded.embed(keys, tags, counts=counts)
            (values * _grads(keys, counts)).sum().backward()
        else:
            result = sharded.lookup(keys, tags, train=True, counts=counts)
            sharded.apply_gradients(result.state, _grads(keys, counts))
            values = result.values
        max_error = max(max_error, float((values.detach() - expected).abs().max()))
    with _plain_ops():
        reference_rows = _rows(reference)
    return {"max_error": max_error, "rows": _rows(sharded.table), "reference": reference_rows,
            "stats": sharded.table.stats()}


def scenario_sgd_single(ctx):
    return _run_against_single_table(ctx, SparseSGD(lr=0.5))


def scenario_adam_single(ctx):
    return _run_against_single_table(ctx, SparseAdam(lr=0.05))


def scenario_sgd_tags_autograd(ctx):
    return _run_against_single_table(ctx, SparseSGD(lr=0.25), with_tags=True, use_autograd=True)


def scenario_adam_eviction(ctx):
    """Small buckets, LFU: eviction happens; each shard must equal a table fed its keys."""
    options = _options(SparseAdam(lr=0.05), max_capacity=64, score_strategy="LFU")
    sharded = ShardedTable(HashTable(options), ctx)
    owners = [HashTable(options) for _ in range(WORLD)]  # one reference per owning rank
    max_error = 0.0
    for step in range(STEPS):
        keys, _, counts = _local_batch(step, ctx.rank)
        g_keys, _, g_counts = _global_batch(step)
        expected_all = torch.empty(len(g_keys), DIM)
        owner = owner_of(g_keys, WORLD)
        for r, table in enumerate(owners):
            mine = owner == r
            expected_all[mine] = _train_reference(table, g_keys[mine], None, g_counts[mine])
        expected = _pick(keys, None, g_keys, None, expected_all)
        sharded.table.advance_step()
        result = sharded.lookup(keys, train=True, counts=counts)
        sharded.apply_gradients(result.state, _grads(keys, counts))
        max_error = max(max_error, float((result.values - expected).abs().max()))
    with _plain_ops():
        reference_rows = _rows(owners[ctx.rank])
    return {"max_error": max_error, "rows": _rows(sharded.table),
            "reference": reference_rows, "stats": sharded.table.stats()}


def scenario_eval_is_read_only(ctx):
    options = _options(SparseSGD(lr=0.5), max_capacity=4096, bucket_capacity=64)
    sharded = ShardedTable(HashTable(options), ctx)
    for step in range(2):
        keys, _, counts = _local_batch(step, ctx.rank)
        sharded.table.advance_step()
        result = sharded.lookup(keys, counts=counts)
        sharded.apply_gradients(result.state, _grads(keys, counts))
    before = sharded.table.size()
    keys = torch.arange(-200, 200, 3, dtype=torch.int64) + ctx.rank
    result = sharded.lookup(keys, train=False)
    return {"state": result.state, "size_change": sharded.table.size() - before,
            "keys": keys, "values": result.values, "rows": _rows(sharded.table)}


def scenario_uneven_and_empty(ctx):
    """Rank 1 sends nothing; rank 0 sends keys that all belong to one owner."""
    keys = torch.arange(0, 400, dtype=torch.int64)
    keys = keys[owner_of(keys, WORLD) == 1][:17] if ctx.rank == 0 else keys[:0]
    splits = exchange_splits(torch.bincount(owner_of(keys, WORLD), minlength=WORLD))[0]
    received = all_to_all(keys, splits)
    rows = all_to_all(received[:, None].to(torch.float32) * 2, splits.reversed())
    batched = exchange_splits(torch.tensor([[ctx.rank, 5], [3, ctx.rank + 1]]))
    return {"splits": splits, "received": received, "echo": rows[:, 0].to(torch.int64),
            "sent": keys, "batched": batched}


def _stale_after_growth(sharded: ShardedTable, rank: int) -> dict:
    """A training lookup, a second one that grows the table, then the first one's
    gradients: refused (TableError), the rows as the second lookup left them."""
    keys, _, counts = _local_batch(0, rank)
    sharded.table.advance_step()
    first = sharded.lookup(keys, train=True, counts=counts)
    capacity = sharded.table.capacity()
    many = torch.arange(5_000, 5_000 + 600, dtype=torch.int64) * (rank + 1)
    second = sharded.lookup(many, train=True, counts=torch.ones_like(many))
    rows = _rows(sharded.table)
    try:
        sharded.apply_gradients(first.state, _grads(keys, counts))
        error = ""
    except TableError as e:
        error = str(e)
    unchanged = _rows(sharded.table) == rows
    sharded.apply_gradients(second.state, _grads(many, torch.ones_like(many)))
    return {"grew": sharded.table.capacity() > capacity, "error": error,
            "unchanged": unchanged, "updated": _rows(sharded.table) != rows}


def scenario_stale_after_growth(ctx):
    options = dataclasses.replace(_options(SparseSGD(lr=0.5), max_capacity=8192,
                                           bucket_capacity=64), init_capacity=256,
                                  admission=None)
    return _stale_after_growth(ShardedTable(HashTable(options), ctx), ctx.rank)


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in sorted(globals().items())
             if name.startswith("scenario_")}


@pytest.fixture(scope="module", params=["reference", "fixed"])
def world(request, tmp_path_factory):
    # "fixed": the ranks run the Triton ops in the interpreter, so the owners serve
    # through the fixed-size path (repeated keys masked, nothing read back).
    with interpreted_triton(request.param == "fixed"):
        results = run_world(SCENARIOS, WORLD, tmp_path_factory.mktemp("world"))
    for name, per_rank in results.items():
        for rank, value in enumerate(per_rank):
            if isinstance(value, Exception) or value is None:
                pytest.fail(f"scenario {name} failed on rank {rank}: {value}")
    return results


def _merged(per_rank, field):
    merged = {}
    for result in per_rank:
        assert not set(merged) & set(result[field])
        merged.update(result[field])
    return merged


@pytest.mark.parametrize("name", ["sgd_single", "adam_single", "sgd_tags_autograd"])
def test_shards_equal_one_table(world, name):
    per_rank = world[name]
    for rank, result in enumerate(per_rank):
        assert result["max_error"] < 1e-6, f"rank {rank} looked up other values"
        keys = torch.tensor([k for k, _ in result["rows"]], dtype=torch.int64)
        assert bool((owner_of(keys, WORLD) == rank).all()), "a shard holds keys it does not own"
    rows = _merged(per_rank, "rows")
    reference = per_rank[0]["reference"]
    assert rows.keys() == reference.keys()
    got = torch.tensor([rows[k] for k in sorted(rows)])
    want = torch.tensor([reference[k] for k in sorted(rows)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    stats = [r["stats"] for r in per_rank]
    assert sum(s["admission_rejected"] for s in stats) > 0  # admission was active
    assert all(s["size"] > 0 for s in stats)


def test_shards_equal_owner_tables_under_eviction(world):
    for rank, result in enumerate(world["adam_eviction"]):
        assert result["max_error"] < 1e-6
        assert result["rows"].keys() == result["reference"].keys()
        got = torch.tensor([result["rows"][k] for k in sorted(result["rows"])])
        want = torch.tensor([result["reference"][k] for k in sorted(result["rows"])])
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert result["stats"]["evictions"] > 0, f"rank {rank} never evicted"
        assert result["stats"]["admission_rejected"] > 0


def test_eval_lookup_reads_without_inserting(world):
    per_rank = world["eval_is_read_only"]
    rows = _merged(per_rank, "rows")
    for result in per_rank:
        assert result["state"] is None and result["size_change"] == 0
        for key, value in zip(result["keys"].tolist(), result["values"]):
            expected = rows.get((key, 0))
            if expected is None:
                assert bool((value == 0).all())  # eval initializer: CONSTANT 0
            else:
                assert value.tolist() == pytest.approx(expected[:DIM])


def test_uneven_splits_and_empty_senders(world):
    rank0, rank1 = world["uneven_and_empty"]
    assert rank0["splits"].send == (0, 17) and rank0["splits"].recv == (0, 0)
    assert rank1["splits"].recv == (17, 0) and rank1["splits"].send == (0, 0)
    assert rank1["received"].tolist() == rank0["sent"].tolist()
    assert rank0["echo"].tolist() == (rank0["sent"] * 2).tolist()
    # Batched size exchange: exchange i, rank r receives row i column r of each sender.
    assert [s.recv for s in rank0["batched"]] == [(0, 1), (3, 3)]
    assert [s.recv for s in rank1["batched"]] == [(5, 5), (1, 2)]


def test_single_rank_path_needs_no_process_group():
    from hashrec.distributed.process_group import single_process_context

    options = _options(SparseSGD(lr=0.5), max_capacity=4096, bucket_capacity=64)
    sharded, reference = ShardedTable(HashTable(options), single_process_context("cpu")), \
        HashTable(options)
    for step in range(3):
        keys, _, counts = _global_batch(step)
        expected = _train_reference(reference, keys, None, counts)
        sharded.table.advance_step()
        values = sharded.embed(keys, counts=counts)
        (values * _grads(keys, counts)).sum().backward()
        torch.testing.assert_close(values.detach(), expected)
    assert _rows(sharded.table) == _rows(reference)


def test_gradients_after_growth_refuse_the_stale_slots(world):
    for rank, result in enumerate(world["stale_after_growth"]):
        assert result["grew"], f"rank {rank}'s table did not grow"
        assert "stale" in result["error"], f"rank {rank} applied stale slots"
        assert result["unchanged"] and result["updated"]


def test_single_rank_gradients_after_growth_refuse_the_stale_slots():
    from hashrec.distributed.process_group import single_process_context

    options = dataclasses.replace(_options(SparseSGD(lr=0.5), max_capacity=8192,
                                           bucket_capacity=64), init_capacity=256,
                                  admission=None)
    result = _stale_after_growth(ShardedTable(HashTable(options),
                                              single_process_context("cpu")), 0)
    assert result["grew"] and "stale" in result["error"]
    assert result["unchanged"] and result["updated"]


def test_unique_pairs_separates_tags():
    keys = torch.tensor([5, 5, 7, 5, 7], dtype=torch.int64)
    tags = torch.tensor([0, 1, 0, 0, 0], dtype=torch.int32)
    unique_keys, unique_tags, inverse = unique_pairs(keys, tags)
    assert list(zip(unique_keys.tolist(), unique_tags.tolist())) == [(5, 0), (5, 1), (7, 0)]
    assert torch.equal(unique_keys[inverse], keys) and torch.equal(unique_tags[inverse], tags)


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_first_occurrences_point_at_each_pairs_first_position(tagged):
    from hashrec.distributed.sharded_lookup import first_occurrences

    g = torch.Generator().manual_seed(2)
    keys = torch.randint(-4, 5, (40,), generator=g)
    tags = torch.randint(0, 2, (40,), generator=g, dtype=torch.int32) if tagged else None
    rep, active = first_occurrences(keys, tags)
    pairs = list(zip(keys.tolist(), tags.tolist() if tagged else [0] * 40))
    assert rep.tolist() == [pairs.index(p) for p in pairs]
    assert active.tolist() == [pairs.index(p) == i for i, p in enumerate(pairs)]
    empty = first_occurrences(torch.empty(0, dtype=torch.int64), None)
    assert empty[0].numel() == empty[1].numel() == 0

"""Shared exchanges of several sharded tables on 2 gloo ranks equal table-by-table exchanges.

Two identical worlds of tables (one with tags and admission, one plain, of
different dims) are trained side by side on every rank: one through
``lookup_many`` / ``apply_gradients_many``, the other through each table's own
``lookup`` / ``apply_gradients``. Rows, stored flags and the tables' contents
must match bit for bit.
"""

from __future__ import annotations

import torch
from dist_workers import run_world

from hashrec.distributed.all_to_all import Splits
from hashrec.distributed.multi_lookup import (
    TableRequest,
    apply_gradients_many,
    exchange_packed,
    lookup_many,
)
from hashrec.distributed.sharded_lookup import ShardedTable
from hashrec.table import AdmissionOptions, InitializerArgs, SparseAdam, TableOptions
from hashrec.table.hash_table import HashTable

WORLD, STEPS = 2, 4


def _tables(ctx) -> list[ShardedTable]:
    init = InitializerArgs(mode="NORMAL", key_seed=5)
    first = TableOptions(dim=4, max_capacity=256, bucket_capacity=8, initializer=init,
                         admission=AdmissionOptions(threshold=2, counter_capacity=1024),
                         optimizer=SparseAdam(lr=0.1))
    second = TableOptions(dim=3, max_capacity=256, bucket_capacity=8, initializer=init,
                          optimizer=SparseAdam(lr=0.1))
    return [ShardedTable(HashTable(first), ctx), ShardedTable(HashTable(second), ctx)]


def _requests(step: int, rank: int) -> list[TableRequest]:
    g = torch.Generator().manual_seed(100 * step + rank)
    keys = torch.unique(torch.randint(-50, 50, (30 + 7 * rank,), generator=g))
    tags = torch.randint(0, 2, keys.shape, generator=g, dtype=torch.int32)
    counts = torch.randint(1, 3, keys.shape, generator=g)
    # rank 1 sends no keys of the second table at step 0 (empty senders)
    second = torch.unique(torch.randint(0, 40, (0 if step == rank == 0 else 20,), generator=g))
    return [TableRequest(keys, tags, counts), TableRequest(second, None, None, lr=0.05)]


def _contents(tables: list[ShardedTable]) -> list[dict]:
    out = []
    for t in tables:
        rows = {}
        for keys, tags, values, _ in t.table.export_state(1024):
            rows.update({(int(k), int(g)): v for k, g, v in zip(keys, tags, values)})
        out.append(rows)
    return out


def scenario_shared(ctx, count: int = 2):
    """The first ``count`` tables through the shared exchanges and through their own."""
    shared, single = _tables(ctx)[:count], _tables(ctx)[:count]
    for step in range(STEPS):
        requests = _requests(step, ctx.rank)[:count]
        for t in shared + single:
            t.table.advance_step()
        many = lookup_many(shared, requests, True)
        one = [t.lookup(r.keys, r.tags, train=True, counts=r.counts, lr=r.lr)
               for t, r in zip(single, requests)]
        for a, b in zip(many, one):
            assert torch.equal(a.values, b.values) and torch.equal(a.stored, b.stored)
        grads = [a.values * 0.5 + 1.0 for a in many]
        apply_gradients_many(shared, [a.state for a in many], grads)
        for t, b, grad in zip(single, one, grads):
            t.apply_gradients(b.state, grad)
    lookup_many(shared, [TableRequest(torch.empty(0, dtype=torch.int64),
                                      torch.empty(0, dtype=torch.int32)),
                         TableRequest(torch.empty(0, dtype=torch.int64))][:count], False)
    a, b = _contents(shared), _contents(single)
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
               for x, y in zip(a, b)), sum(len(x) for x in a)


def scenario_one_table(ctx):
    """One table: its exchanges go out unpacked."""
    return scenario_shared(ctx, count=1)


def test_shared_exchanges_equal_table_by_table(tmp_path):
    worlds = run_world({"shared": scenario_shared, "one": scenario_one_table}, WORLD,
                       tmp_path)
    for results in worlds.values():
        for result in results:
            assert not isinstance(result, Exception), result
            same, stored = result
            assert same and stored > 0


def test_exchange_packed_on_one_rank_returns_each_tensor():
    a = torch.arange(6, dtype=torch.float32).view(3, 2)
    b = torch.arange(4, dtype=torch.float32).view(4, 1)
    out = exchange_packed([a, b], [Splits((3,), (3,)), Splits((4,), (4,))])
    assert torch.equal(out[0], a) and torch.equal(out[1], b)

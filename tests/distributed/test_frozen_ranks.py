"""A frozen dynamic table on 2 gloo ranks: read as in evaluation while a trainable one
beside it trains like one process on the global batch."""

from __future__ import annotations

import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import all_reduce_gradients
from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import InitializerArgs, SparseAdam, TableOptions
from hashrec.table.hashing import owner_of

WORLD, ROWS, STEPS, DIM = 2, 6, 4, 4
KNOWN = torch.arange(0, 30, 3)  # the frozen table's keys; the batches read 0..29


def _collection(ctx=None) -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=5)
    tables = [EmbeddingTableSpec(name, DIM, trainable=name == "live", dynamic=TableOptions(
        dim=DIM, max_capacity=256, bucket_capacity=32, score_strategy="STEP",
        initializer=init)) for name in ("live", "frozen")]
    features = [EmbeddingFeatureSpec("a", "live"), EmbeddingFeatureSpec("b", "frozen")]
    collection = EmbeddingCollection(tables, features, SparseAdam(lr=0.05), "cpu", dist=ctx)
    mine = KNOWN if ctx is None else KNOWN[owner_of(KNOWN, WORLD) == ctx.rank]
    rows = torch.cat([_known_rows(mine), torch.zeros(mine.numel(), 2 * DIM)], 1)  # Adam's
    collection.dynamic_tables()["frozen"].load_state(mine, None, rows,
                                                     torch.full((mine.numel(),), 3))
    return collection


def _known_rows(keys: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.full((DIM,), float(k)) / 30 for k in keys.tolist()]) \
        if keys.numel() else torch.empty(0, DIM)


def _kjt(step: int, rows: slice) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 30, (2, WORLD * ROWS, 2), generator=g)[:, rows]
    return KeyedJaggedTensor.from_lengths(["a", "b"], ids.reshape(-1),
                                          torch.full((2 * ids.shape[1],), 2))


def _train(ctx=None):
    collection = _collection(ctx)
    rows = slice(None) if ctx is None else slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS)
    head = torch.nn.Linear(2 * DIM, 1)
    torch.nn.init.constant_(head.weight, 0.5)
    torch.nn.init.constant_(head.bias, 0.1)
    pooled = []
    for step in range(STEPS):
        out = collection(_kjt(step, rows))
        x = torch.cat([out.pooled["a"], out.pooled["b"]], 1)
        head(x).pow(2).mean().backward()  # each rank's mean: the ranks average
        if ctx is not None:
            all_reduce_gradients(list(head.parameters()), ctx)
        pooled.append(out.pooled["b"].detach())
    tables = {}
    for name, table in collection.dynamic_tables().items():
        (keys, _, values, scores), = table.export_state(1 << 12)
        tables[name] = dict(zip(keys.tolist(), values[:, :DIM].tolist()))
        tables[name + "_scores"] = dict(zip(keys.tolist(), scores.tolist()))
    return {"pooled": pooled, "tables": tables}


def scenario_frozen(ctx):
    return _train(ctx)


def test_a_frozen_table_beside_a_trained_one_on_two_ranks(tmp_path):
    (ranks,) = run_world({"frozen": scenario_frozen}, WORLD, tmp_path).values()
    for r in ranks:
        if isinstance(r, Exception):
            raise r
    ref = _train()
    known = dict(zip(KNOWN.tolist(), _known_rows(KNOWN).tolist()))
    assert ref["tables"]["frozen"] == known
    assert set(ref["tables"]["frozen_scores"].values()) == {3}
    union = {}
    for rank, r in enumerate(ranks):
        assert r["tables"]["frozen"] == {k: v for k, v in known.items()
                                         if owner_of(torch.tensor([k]), WORLD) == rank}
        assert set(r["tables"]["frozen_scores"].values()) == {3}
        union.update(r["tables"]["live"])
        for step, pooled in enumerate(r["pooled"]):
            mine = ref["pooled"][step][rank * ROWS:(rank + 1) * ROWS]
            torch.testing.assert_close(pooled, mine)
    # The trained table beside it: the same keys and rows as one process.
    assert union.keys() == ref["tables"]["live"].keys() and len(union) > len(KNOWN)
    for key, row in union.items():
        torch.testing.assert_close(torch.tensor(row), torch.tensor(ref["tables"]["live"][key]),
                                   atol=2e-5, rtol=1e-4)

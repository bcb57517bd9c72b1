"""EmbeddingCollection on 2 gloo ranks trains exactly like one process on the same global batches.

Tables: a dynamic table under eviction pressure (STEP scores; hot ids read every
step, fresh ids never read again, so eviction only drops ids that no later step
reads and both runs stay comparable), a dynamic table with frequency admission,
and a dense table. A linear head on the pooled embeddings is trained with
averaged dense gradients. Rank r takes rows [r * B, (r + 1) * B) of each global
batch of 2 * B rows; the single-process reference runs in the test process.
"""

from __future__ import annotations

import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import FlatGradients, all_reduce_gradients
from hashrec.distributed.metrics import all_reduce_sum
from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import AdmissionOptions, InitializerArgs, SparseAdam, TableOptions
from hashrec.table.hashing import owner_of

WORLD, ROWS, STEPS, DIM, HOT = 2, 8, 14, 4, 8
FEATURES = ("hot", "adm", "cat")


def _collection(ctx=None, dense_only: bool = False,
                dtype: torch.dtype = torch.float32) -> EmbeddingCollection:
    """The scenario's tables, storing ``dtype`` rows; ``dense_only``: the two dynamic
    tables are dense ones."""
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=7)
    tables = [
        EmbeddingTableSpec("evict", DIM, num_rows=10_400, initializer=init, dtype=dtype),
        EmbeddingTableSpec("admit", DIM, num_rows=40, initializer=init, dtype=dtype),
    ] if dense_only else [
        EmbeddingTableSpec("evict", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=128, bucket_capacity=32, score_strategy="STEP",
            initializer=init, check_mode="IGNORE", dtype=dtype)),
        EmbeddingTableSpec("admit", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=1024, bucket_capacity=32, initializer=init,
            admission=AdmissionOptions(threshold=3, counter_capacity=4096), dtype=dtype)),
    ]
    tables.append(EmbeddingTableSpec("dense", DIM, num_rows=20, initializer=InitializerArgs(
        mode="NORMAL", std_dev=0.1, key_seed=3), dtype=dtype))
    features = [EmbeddingFeatureSpec("hot", "evict"), EmbeddingFeatureSpec("adm", "admit"),
                EmbeddingFeatureSpec("cat", "dense", pooling="mean")]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.05), "cpu", dist=ctx)


def _global_batch(step: int, world: int = WORLD
                  ) -> tuple[dict[str, list[list[int]]], torch.Tensor]:
    """Per feature, one bag of ids per row of the world * ROWS global batch; labels
    (world * ROWS,)."""
    g = torch.Generator().manual_seed(step)
    n = world * ROWS
    hot = [[r % HOT, 10_000 + step * n + r] for r in range(n)]  # fresh ids: read once
    adm = torch.randint(0, 40, (n, 2), generator=g).tolist()
    cat = [torch.randint(0, 20, (1 + r % 3,), generator=g).tolist() for r in range(n)]
    labels = torch.randint(0, 2, (n,), generator=g).float()
    return {"hot": hot, "adm": adm, "cat": cat}, labels


def _kjt(bags: dict[str, list[list[int]]], rows: slice) -> KeyedJaggedTensor:
    values, lengths = [], []
    for name in FEATURES:
        for bag in bags[name][rows]:
            values += bag
            lengths.append(len(bag))
    return KeyedJaggedTensor.from_lengths(list(FEATURES), torch.tensor(values, dtype=torch.int64),
                                          torch.tensor(lengths, dtype=torch.int64))


def _head() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(len(FEATURES) * DIM, 1)


def _loss(collection, head, kjt, labels) -> torch.Tensor:
    out = collection(kjt)
    x = torch.cat([out.pooled[name] for name in FEATURES], 1)
    return torch.nn.functional.binary_cross_entropy_with_logits(head(x).squeeze(1), labels)


def _train(ctx=None, prepare: bool | int = False, flat: bool = False,
           dense_only: bool = False, dtype: torch.dtype = torch.float32):
    """STEPS steps; on ranks, each takes its rows. Returns per-step global losses.
    ``prepare``: each batch's dedup is started ahead (the ranks share its sizes); 2: two
    batches ahead, the batch after the next prepared at the end of a step.
    ``flat``: the head's gradients are FlatGradients averaged in the embedding backward's
    exchange; the steps where they were are counted (the last value returned).
    ``dtype``: of the tables' rows."""
    collection, head = _collection(ctx, dense_only, dtype), _head()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    rank = ctx.rank if ctx is not None else 0
    rows = slice(rank * ROWS, (rank + 1) * ROWS) if ctx is not None else slice(None)
    gradients = FlatGradients(list(head.parameters()), ctx) if flat else None
    if gradients is not None:
        collection.carry_network_gradients(gradients)
    losses, carried = [], 0
    kjts = [_kjt(_global_batch(step)[0], rows) for step in range(STEPS)]
    for kjt in kjts[:2] if prepare == 2 else []:
        collection.prepare(kjt)
    for step in range(STEPS):
        labels = _global_batch(step)[1]
        optimizer.zero_grad() if gradients is None else gradients.zero()
        kjt = kjts[step]
        if prepare is True:
            collection.prepare(kjt)
        loss = _loss(collection, head, kjt, labels[rows])
        loss.backward()
        if gradients is not None:
            carried += gradients.averaged
            gradients.all_reduce()
        elif ctx is not None:
            all_reduce_gradients(list(head.parameters()), ctx)
        if ctx is not None:
            loss = all_reduce_sum(loss, ctx) / ctx.world_size
        optimizer.step()
        if prepare == 2 and step + 2 < STEPS:
            collection.prepare(kjts[step + 2])
        losses.append(float(loss.detach()))
    return collection, head, losses, carried


def _rows(table) -> dict[int, list[float]]:
    out = {}
    for keys, _, rows, _ in table.export_state(1 << 12):
        out.update(zip(keys.tolist(), rows[:, :DIM].tolist()))
    return out


def _eval_pooled(collection, ctx=None) -> torch.Tensor | None:
    """Eval-mode pooled 'hot' and 'adm' of the first ROWS rows of a new batch; on ranks,
    rank 1 has no batch and serves rank 0's lookups."""
    collection.eval()
    bags, _ = _global_batch(STEPS + 1)
    with torch.no_grad():
        if ctx is not None and ctx.rank == 1:
            collection.idle_lookups()
            return None
        out = collection(_kjt(bags, slice(0, ROWS)))
    return torch.cat([out.pooled["hot"], out.pooled["adm"]], 1)


def scenario_train(ctx, prepare: bool | int = False, flat: bool = False,
                   dtype: torch.dtype = torch.float32):
    collection, head, losses, carried = _train(ctx, prepare, flat, dtype=dtype)
    tables = collection.dynamic_tables()
    return {"losses": losses, "carried": carried, "head": [p.detach() for p in head.parameters()],
            "dense": collection.dense_tables["dense"].rows[:, :DIM].clone(),
            "tables": {name: _rows(t) for name, t in tables.items()},
            "stats": {name: t.stats() for name, t in tables.items()},
            "eval": _eval_pooled(collection, ctx)}


def scenario_train_gathered(ctx):
    """``scenario_train`` with every batch prepared ahead and the dense table's gradients
    on the exchange of large dense tables: all-gathered in the sizes the ranks shared at
    dedup (the dense table joins the 'evict' storage, so its rows per rank are its
    share of the join's)."""
    from hashrec.embedding import sharded

    limit, sharded.DENSE_REDUCE_MAX_ELEMENTS = sharded.DENSE_REDUCE_MAX_ELEMENTS, 0
    try:
        return scenario_train(ctx, prepare=True)
    finally:  # the next scenario of this worker process sees the real limit
        sharded.DENSE_REDUCE_MAX_ELEMENTS = limit


def scenario_train_two_ahead(ctx):
    """``scenario_train`` with the batch after the next prepared at the end of each step;
    ``inline`` counts the forwards that deduplicated in the forward."""
    from hashrec.embedding import collection as collection_module

    real, inline = collection_module.dedup_storages, []
    collection_module.dedup_storages = \
        lambda storages, **kw: inline.append(1) or real(storages, **kw)
    try:
        return {**scenario_train(ctx, prepare=2), "inline": len(inline)}
    finally:
        collection_module.dedup_storages = real


def scenario_train_flat(ctx):
    """``scenario_train`` with the head's gradients carried by the sparse gradient exchange."""
    return scenario_train(ctx, flat=True)


def scenario_train_half(ctx):
    """``scenario_train`` with every table's rows in float16 (a data_type FP16 config)."""
    return scenario_train(ctx, prepare=True, dtype=torch.float16)


def scenario_dense_only(ctx):
    """Dense tables only, the head's gradients carried by their all-reduce."""
    collection, head, losses, carried = _train(ctx, flat=True, dense_only=True)
    return {"losses": losses, "carried": carried, "head": [p.detach() for p in head.parameters()],
            "tables": {name: t.rows[:, :DIM].clone()
                       for name, t in collection.dense_tables.items()}}


def scenario_dense_only_gathered(ctx):
    """``scenario_dense_only`` with every dense table on the all-gather of large tables,
    which the head's gradients then join."""
    from hashrec.embedding import sharded

    limit, sharded.DENSE_REDUCE_MAX_ELEMENTS = sharded.DENSE_REDUCE_MAX_ELEMENTS, 0
    try:
        return scenario_dense_only(ctx)
    finally:
        sharded.DENSE_REDUCE_MAX_ELEMENTS = limit


def test_two_ranks_of_dense_tables_only_train_like_one_process(tmp_path):
    worlds = run_world({"dense": scenario_dense_only, "gathered": scenario_dense_only_gathered},
                       WORLD, tmp_path)
    collection, head, losses, _ = _train(dense_only=True)
    for r in worlds["dense"] + worlds["gathered"]:
        if isinstance(r, Exception):
            raise r
        assert r["carried"] == STEPS
        assert _close(r["losses"], losses)
        for mine, ref in zip(r["head"], head.parameters()):
            assert _close(mine, ref.detach())
        assert r["tables"].keys() == collection.dense_tables.keys() and len(r["tables"]) == 3
        for name, rows in r["tables"].items():
            assert _close(rows, collection.dense_tables[name].rows[:, :DIM]), name


def _close(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=2e-5, rtol=1e-4)


def test_two_ranks_train_like_one_process_on_the_global_batch(tmp_path):
    worlds = run_world({"train": scenario_train, "gathered": scenario_train_gathered,
                        "flat": scenario_train_flat, "two_ahead": scenario_train_two_ahead},
                       WORLD, tmp_path)
    collection, head, losses, _ = _train()
    for ranks in worlds.values():
        _check_like_one_process(ranks, collection, head, losses)
    assert [r["carried"] for r in worlds["flat"]] == [STEPS] * WORLD
    assert [r["carried"] for r in worlds["train"]] == [0] * WORLD
    # Only rank 0's eval forward (a batch nobody prepared) deduplicates in the forward.
    assert [r["inline"] for r in worlds["two_ahead"]] == [1, 0]


def test_two_ranks_of_half_tables_train_like_one_process(tmp_path):
    """Rows stored in float16 travel between the ranks as float32 and are updated where
    they are stored, as in one process. (The ranks sum gradients in another order: far
    below a float16 step, but an update that lands near a rounding tie can round the other
    way, so the rows agree within one float16 step.)"""
    (ranks,) = run_world({"half": scenario_train_half}, WORLD, tmp_path).values()
    collection, head, losses, _ = _train(dtype=torch.float16)
    assert {t.options.dtype for t in collection.dynamic_tables().values()} == {torch.float16}
    assert collection.dense_tables["dense"].rows.dtype == torch.float16
    _check_like_one_process(ranks, collection, head, losses, rows_close=_close_half)


def _close_half(a, b) -> bool:
    """Within one float16 step (2^-10 of the value) of each other."""
    return torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=2e-5,
                          rtol=2.0 ** -10)


def _check_like_one_process(ranks, collection, head, losses, rows_close=_close) -> None:
    for r in ranks:
        if isinstance(r, Exception):
            raise r
    ref_tables = collection.dynamic_tables()
    # The scenario exercises what it claims to.
    assert ref_tables["evict"].stats()["evictions"] > 0
    assert sum(r["stats"]["evict"]["evictions"] for r in ranks) > 0
    # Each key is counted on its owner alone: the ranks' rejections and inserts sum to
    # one process's (no counter evicts here), as the progress line sums them.
    for counter in ("admission_rejected", "inserts", "refused"):
        assert sum(r["stats"]["admit"][counter] for r in ranks) == \
            ref_tables["admit"].stats()[counter], counter
    assert ref_tables["admit"].stats()["admission_rejected"] > 0
    for r in ranks:
        assert _close(r["losses"], losses)
        for mine, ref in zip(r["head"], head.parameters()):
            assert _close(mine, ref.detach())
        assert rows_close(r["dense"], collection.dense_tables["dense"].rows[:, :DIM])
    for name, table in ref_tables.items():
        expected = _rows(table)
        union = {}
        for rank, r in enumerate(ranks):
            shard = r["tables"][name]
            keys = torch.tensor(sorted(shard), dtype=torch.int64)
            assert bool((owner_of(keys, WORLD) == rank).all()), f"{name}: foreign keys on {rank}"
            union.update(shard)
        if name == "evict":
            # Buckets differ between one table and two shards, so which stale fresh ids
            # were evicted differs; the ids still read (hot) and every id kept by both
            # must agree.
            assert set(range(HOT)) <= set(union) & set(expected)
            assert len(union) <= 128 and len(expected) <= 128
        else:
            assert set(union) == set(expected), name
        for key in set(union) & set(expected):
            assert rows_close(union[key], expected[key]), (name, key)
    assert ranks[1]["eval"] is None
    assert _close(ranks[0]["eval"], _eval_pooled(collection))

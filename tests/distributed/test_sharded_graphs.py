"""The padded sharded lookup (``HASHREC_SHARDED_GRAPHS=1``) trains like the eager one.

Two gloo ranks train a collection whose one dynamic storage is looked up through the
padded chain of ``hashrec.distributed.sharded_graphs`` (every rank sends every peer
the same number of rows, padding included; on CPU the chain runs uncaptured), and
again through the eager exchanges; both runs must agree: losses, the head, the dense
table, every stored row and the tables' counters. The dynamic storage is under
eviction pressure and frequency admission; it is fused (two tables, tags) or a
single table read by two features. With two dynamic storages (``test_sharded_collection``'s
tables) each takes its own padded chain.
"""

from __future__ import annotations

import functools
import os

import pytest
import test_sharded_collection
import torch
from dist_workers import run_world
from test_sharded_collection import DIM, ROWS, STEPS, WORLD, _global_batch, _head, _kjt, _loss

from hashrec.distributed.data_parallel import FlatGradients
from hashrec.distributed.metrics import all_reduce_sum
from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.table import AdmissionOptions, InitializerArgs, SparseAdam, TableOptions


def _collection(ctx, kind: str) -> EmbeddingCollection:
    """``kind``: "fused" (one storage, two tables), "single" (one table, two features),
    "two" (two dynamic storages and a dense table)."""
    if kind == "two":
        return test_sharded_collection._collection(ctx)
    fused = kind == "fused"
    # Hashed per key (the ranks and both chains agree) and computed in the kernel (a
    # table whose initial rows come from the host is never captured).
    init = InitializerArgs(mode="UNIFORM", lower=-0.1, upper=0.1, key_seed=7)

    # Shards small enough to evict: more ranks, smaller shards.
    capacity = 32 if ctx.world_size <= 2 else 16

    def options() -> TableOptions:
        return TableOptions(dim=DIM, max_capacity=capacity, bucket_capacity=16,
                            score_strategy="STEP",
                            initializer=init, check_mode="IGNORE",
                            admission=AdmissionOptions(threshold=2, counter_capacity=4096))

    group = "dyn" if fused else None
    tables = [EmbeddingTableSpec("evict", DIM, dynamic=options(), fusion_group=group)]
    if fused:
        tables.append(EmbeddingTableSpec("admit", DIM, dynamic=options(), fusion_group=group))
    tables.append(EmbeddingTableSpec("dense", DIM, num_rows=20, initializer=InitializerArgs(
        mode="NORMAL", std_dev=0.1, key_seed=3)))
    features = [EmbeddingFeatureSpec("hot", "evict"),
                EmbeddingFeatureSpec("adm", "admit" if fused else "evict"),
                EmbeddingFeatureSpec("cat", "dense", pooling="mean")]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.05), ctx.device, dist=ctx)


def _train(ctx, kind: str, steps: int) -> dict:
    """``steps`` steps, each batch prepared a step ahead as the trainer does (the ranks
    share its sizes: on GPUs beside the training stream, while the step's captured
    exchanges run). The head's gradients ride along the sparse gradient exchange, as the
    trainer's do."""
    collection, head = _collection(ctx, kind), _head().to(ctx.device)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    flat = FlatGradients(list(head.parameters()), ctx)
    collection.carry_network_gradients(flat)
    rows = slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS)
    losses, rode = [], 0
    batches = [_global_batch(step, ctx.world_size) for step in range(steps)]
    kjts = [_kjt(bags, rows).to(ctx.device) for bags, _ in batches]
    collection.prepare(kjts[0])
    for step in range(steps):
        flat.zero()
        kjt = kjts[step]
        if step + 1 < steps:
            collection.prepare(kjts[step + 1])
        loss = _loss(collection, head, kjt, batches[step][1][rows].to(ctx.device))
        loss.backward()
        rode += flat.averaged
        flat.all_reduce()
        optimizer.step()
        losses.append(float(all_reduce_sum(loss.detach(), ctx) / ctx.world_size))
    tables = collection.dynamic_tables()
    graphs = [collection._sharded.sharded[name].graphs()
              for name in collection._sharded.sharded]
    return {"losses": losses, "head": [p.detach().cpu() for p in head.parameters()],
            "dense": collection.dense_tables["dense"].rows[:, :DIM].cpu(),
            "tables": {name: _export(t) for name, t in tables.items()},
            "stats": {name: t.stats() for name, t in tables.items()},
            "padded": sum(g.lookups for g in graphs if g is not None),
            "fixed": [g._graph_mode() for g in graphs if g is not None],
            "replays": sum(g.replays for g in graphs if g is not None), "rode": rode}


def _export(table) -> dict[tuple[int, int], list[float]]:
    out = {}
    for keys, tags, rows, _ in table.export_state(1 << 12):
        tags = tags.tolist() if tags is not None else [0] * keys.numel()
        out.update(zip(zip(keys.tolist(), tags), rows.tolist()))
    return out


def _scenario(ctx, padded: bool, kind: str, steps: int = STEPS, exact: bool = True):
    """``_train`` with the padded chain on or off. ``exact``: capacities without size-class
    slack (``MIN_STEP`` 1 and the small sizes here), so that a capacity below what some
    rank sends some rank would show; else one capacity for every step (1024)."""
    from hashrec.table import lookup_graphs

    before = os.environ.get("HASHREC_SHARDED_GRAPHS")
    os.environ["HASHREC_SHARDED_GRAPHS"] = "1" if padded else "0"
    step = lookup_graphs.MIN_STEP
    lookup_graphs.MIN_STEP = 1 if exact else step
    try:
        return _train(ctx, kind, steps)
    finally:  # the next scenario of this worker sees the settings it had
        lookup_graphs.MIN_STEP = step
        if before is None:
            os.environ.pop("HASHREC_SHARDED_GRAPHS")
        else:
            os.environ["HASHREC_SHARDED_GRAPHS"] = before


def _close(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["fused", "single", "two"])
def test_the_padded_sharded_lookup_trains_like_the_eager_one(tmp_path, kind):
    assert set(_check_padded_like_eager(tmp_path, kind, STEPS)) == {False}


def test_the_padded_sharded_lookup_on_three_ranks_trains_like_the_eager_one(tmp_path):
    """Three ranks: every rank pads for two peers, whose capacities differ from its own
    sends."""
    assert set(_check_padded_like_eager(tmp_path, "fused", STEPS, world=3)) == {False}


def test_the_padded_chain_on_the_fixed_size_path_trains_like_the_eager_one(tmp_path):
    """The owners' lookup through the table's fixed-size path (the one a graph holds; its
    Triton kernels interpreted on the CPU), fused tables, fewer steps (slow)."""
    env = {"HASHREC_FORCE_TRITON": "1", "TRITON_INTERPRET": "1"}
    assert _check_padded_like_eager(tmp_path, "fused", 5, env) == [True]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_the_captured_sharded_lookup_trains_like_the_eager_one_on_gpus(tmp_path):
    """Two ranks on two GPUs (NCCL): the padded chain captured and replayed, forward and
    backward, against the eager exchanges."""
    worlds = _check_padded_like_eager(tmp_path, "fused", STEPS, cuda=True, exact=False)
    assert all(r["replays"] > 0 for r in worlds["padded"]), "no replay: nothing was captured"


def _check_padded_like_eager(tmp_path, kind: str, steps: int,
                             env: dict[str, str] | None = None, cuda: bool = False,
                             exact: bool = True, world: int = WORLD):
    """Runs both on ``world`` ranks and compares them; returns whether the padded run's
    tables took the fixed-size path (on GPUs: every run's results)."""
    run = functools.partial(_scenario, kind=kind, steps=steps, exact=exact)
    worlds = run_world({"padded": functools.partial(run, padded=True),
                        "eager": functools.partial(run, padded=False)},
                       world, tmp_path, env, cuda)
    for ranks in worlds.values():
        for r in ranks:
            if isinstance(r, Exception):
                raise r
    for padded, eager in zip(worlds["padded"], worlds["eager"]):
        storages = len(padded["fixed"])
        assert storages == (2 if kind == "two" else 1)
        assert padded["padded"] == steps * storages and eager["padded"] == 0
        assert padded["rode"] == eager["rode"] == steps
        assert _close(padded["losses"], eager["losses"])
        for mine, ref in zip(padded["head"], eager["head"]):
            assert _close(mine, ref)
        assert _close(padded["dense"], eager["dense"])
        assert padded["stats"] == eager["stats"]
        assert padded["tables"].keys() == eager["tables"].keys()
        for name, rows in padded["tables"].items():
            assert rows.keys() == eager["tables"][name].keys(), name
            for key, row in rows.items():
                assert _close(row, eager["tables"][name][key]), (name, key)
    # The scenario exercises what it claims to.
    stats = [s for r in worlds["eager"] for s in r["stats"].values()]
    assert sum(s["evictions"] for s in stats) > 0
    assert sum(s["admission_rejected"] for s in stats) > 0
    return worlds if cuda else worlds["padded"][0]["fixed"]


def test_releasing_drops_every_captured_chain():
    from types import SimpleNamespace

    from hashrec.distributed import sharded_graphs

    resets = []
    graphs = sharded_graphs.ShardedGraphs(
        SimpleNamespace(table=SimpleNamespace(device=torch.device("cpu")), world_size=2),
        capture=False)
    chain = sharded_graphs._Chain(1024, 2, torch.device("cpu"), tagged=False, clocked=True)
    chain.graph = SimpleNamespace(reset=lambda: resets.append("forward"))
    backward = sharded_graphs._Backward(2048, 4, None, torch.device("cpu"))
    backward.graph = SimpleNamespace(reset=lambda: resets.append("backward"))
    chain.backward[(4, 0, 0.5)] = backward
    graphs._chains[(1024, False, True)] = chain
    sharded_graphs.release_graphs()
    assert resets == ["backward", "forward"] and not graphs._chains and chain.graph is None
    assert not chain.backward


def test_tables_with_caller_scores_keep_the_eager_exchanges():
    """CUSTOMIZED scores come from the caller; the eager chain refuses them without."""
    from types import SimpleNamespace

    from hashrec.distributed import sharded_graphs
    from hashrec.table.options import ScoreStrategy

    table = SimpleNamespace(device=torch.device("cpu"),
                            options=SimpleNamespace(name="scored",
                                                    score_strategy=ScoreStrategy.CUSTOMIZED))
    graphs = sharded_graphs.ShardedGraphs(SimpleNamespace(table=table, world_size=2),
                                          capture=False)
    assert not graphs.fits(10)


def test_a_lookup_too_large_for_the_padded_chain_says_why_once(caplog, monkeypatch):
    from types import SimpleNamespace

    from hashrec.distributed import sharded_graphs
    from hashrec.table import lookup_graphs
    from hashrec.table.options import ScoreStrategy

    monkeypatch.setattr(lookup_graphs, "MAX_KEYS", 4096)
    table = SimpleNamespace(device=torch.device("cpu"), options=SimpleNamespace(
        name="deep", score_strategy=ScoreStrategy.STEP))
    graphs = sharded_graphs.ShardedGraphs(SimpleNamespace(table=table, world_size=2),
                                          capture=False)
    with caplog.at_level("INFO", logger="hashrec.distributed"):
        assert graphs.fits(1000)
        assert not graphs.fits(3000) and not graphs.fits(5000)
    said = [r.getMessage() for r in caplog.records if "eager exchanges" in r.getMessage()]
    assert len(said) == 1 and "'deep'" in said[0] and "3000 keys to one peer" in said[0]


def test_the_padded_chain_is_the_default_where_it_can_be_captured(monkeypatch):
    from types import SimpleNamespace

    from hashrec.distributed.sharded_graphs import sharded_graphs_enabled

    def table(device: str, fixed: bool):
        return SimpleNamespace(device=torch.device(device), _fixed_path=lambda: fixed)

    cpu, cuda, hybrid = table("cpu", False), table("cuda", True), table("cuda", False)
    monkeypatch.delenv("HASHREC_SHARDED_GRAPHS", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert sharded_graphs_enabled(cuda)
    assert not sharded_graphs_enabled(cpu) and not sharded_graphs_enabled(hybrid)
    monkeypatch.setenv("HASHREC_SHARDED_GRAPHS", "0")
    assert not any(sharded_graphs_enabled(t) for t in (cpu, cuda, hybrid))
    monkeypatch.setenv("HASHREC_SHARDED_GRAPHS", "1")
    assert all(sharded_graphs_enabled(t) for t in (cpu, cuda, hybrid))
    monkeypatch.setenv("HASHREC_SHARDED_GRAPHS", "yes")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        sharded_graphs_enabled(cpu)

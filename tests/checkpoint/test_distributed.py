"""Resharding under torch.distributed (gloo, CPU): saved on 2 ranks, loaded on 1 and 4; a
nearly full table saved on 2 ranks loads on 1 (its keys fill the buckets unevenly there)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from checkpoint_helpers import (
    adam_options,
    assert_same,
    merge_snapshots,
    snapshot,
    table_options,
    train_steps,
    trained_table,
)

from hashrec.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.table import HashTable
from hashrec.table.hashing import owner_of

SAVE_WORLD = 2
FULL_CAPACITY = 512  # rows over all ranks, as a feature's max_capacity counts them


def _init(rank: int, world_size: int, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)


def _tables(rank: int, world_size: int, train: bool) -> dict[str, HashTable]:
    if not train:
        return {"user": HashTable(table_options()), "fused": HashTable(adam_options())}
    return {"user": trained_table(steps=10, rank=rank, world_size=world_size),
            "fused": trained_table(steps=6, seed=1, rank=rank, world_size=world_size,
                                   options=adam_options(), tagged=True)}


def _save_worker(rank: int, world_size: int, store: str, model_dir: str, out: str) -> None:
    _init(rank, world_size, store)
    torch.manual_seed(0)
    tables = _tables(rank, world_size, train=True)
    save_checkpoint(model_dir, 10, torch.nn.Linear(2, 2), None, tables, chunk_rows=16,
                    extra={"epoch": 1})
    torch.save({name: snapshot(t) for name, t in tables.items()},
               os.path.join(out, f"saved-{rank}.pt"))
    # The same ranks then restore with a wrong dim on rank 1 only: both must raise.
    fresh = _tables(rank, world_size, train=False)
    if rank == 1:
        fresh["user"] = HashTable(table_options(dim=8))
    try:
        restore_checkpoint(os.path.join(model_dir, "model.ckpt-10"), None, None, fresh)
        error = ""
    except CheckpointError as e:
        error = str(e)
    torch.save({"error": error}, os.path.join(out, f"failed-{rank}.pt"))
    dist.destroy_process_group()


def _load_worker(rank: int, world_size: int, store: str, path: str, out: str) -> None:
    _init(rank, world_size, store)
    tables = _tables(rank, world_size, train=False)
    meta = restore_checkpoint(path, torch.nn.Linear(2, 2), None, tables)
    result = {"meta_world": meta["world_size"],
              "tables": {name: snapshot(t) for name, t in tables.items()}}
    torch.save(result, os.path.join(out, f"loaded-{world_size}-{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    model_dir = str(root / "model")
    mp.spawn(_save_worker, args=(SAVE_WORLD, str(root / "store"), model_dir, str(root)),
             nprocs=SAVE_WORLD, join=True)
    snaps = [torch.load(root / f"saved-{r}.pt") for r in range(SAVE_WORLD)]
    expected = {name: merge_snapshots([s[name] for s in snaps]) for name in snaps[0]}
    return root, os.path.join(model_dir, "model.ckpt-10"), expected


def _load(root, path: str, world_size: int) -> list[dict]:
    store = str(root / f"store-load-{world_size}")
    mp.spawn(_load_worker, args=(world_size, store, path, str(root)),
             nprocs=world_size, join=True)
    return [torch.load(root / f"loaded-{world_size}-{r}.pt") for r in range(world_size)]


def _check_owned(results: list[dict], expected: dict, world_size: int) -> None:
    for rank, result in enumerate(results):
        assert result["meta_world"] == SAVE_WORLD
        for snap in result["tables"].values():
            assert bool((owner_of(snap["keys"], world_size) == rank).all())
            assert bool((owner_of(snap["counter_keys"], world_size) == rank).all())
    for name, want in expected.items():
        assert len(want["keys"]) > 0 and len(want["counter_keys"]) > 0
        got = merge_snapshots([r["tables"][name] for r in results])
        assert_same(got, want)


def test_saved_on_two_ranks_loads_on_one_process(saved):
    _, path, expected = saved
    tables = _tables(0, 1, train=False)
    restore_checkpoint(path, None, None, tables)
    _check_owned([{"meta_world": SAVE_WORLD,
                   "tables": {n: snapshot(t) for n, t in tables.items()}}], expected, 1)


def test_saved_on_two_ranks_loads_on_four(saved):
    root, path, expected = saved
    _check_owned(_load(root, path, 4), expected, 4)


def test_one_rank_failing_fails_every_rank(saved):
    root, _, _ = saved
    errors = [torch.load(root / f"failed-{r}.pt")["error"] for r in range(SAVE_WORLD)]
    assert "embedding dim 4" in errors[1]
    assert "another rank" in errors[0]


def _full_table(world_size: int) -> HashTable:
    """A rank's share of a table of FULL_CAPACITY rows over ``world_size`` ranks."""
    return HashTable(table_options(admission=False,
                                   max_capacity=math.ceil(FULL_CAPACITY / world_size)))


def _save_full_worker(rank: int, world_size: int, store: str, model_dir: str) -> None:
    _init(rank, world_size, store)
    table = _full_table(world_size)
    train_steps(table, 1, 20, rank=rank, world_size=world_size)  # about 650 keys
    save_checkpoint(model_dir, 20, None, None, {"t": table})
    dist.destroy_process_group()


def test_a_nearly_full_table_saved_on_two_ranks_loads_on_one_evicting_or_grown(tmp_path, caplog):
    model_dir = str(tmp_path / "model")
    mp.spawn(_save_full_worker, args=(SAVE_WORLD, str(tmp_path / "store"), model_dir),
             nprocs=SAVE_WORLD, join=True)
    path = os.path.join(model_dir, "model.ckpt-20")
    saved = read_complete_meta(path)["tables"]["t"]["num_rows"]
    assert saved > 0.95 * FULL_CAPACITY
    table = _full_table(1)
    with caplog.at_level("WARNING", logger="hashrec.checkpoint.table_io"):
        meta = restore_checkpoint(path, None, None, {"t": table})
    held = int(table.size())
    assert meta["loaded"]["t"]["rows"] == saved and held < saved
    assert (f"table 't': {saved} rows of {path}/dynamicemb/t belong here, the table holds "
            f"{held} (room for {FULL_CAPACITY}, but the keys fill its buckets unevenly): the "
            f"{saved - held} rows") in caplog.text
    # For evaluation and export the table grows past max_capacity and holds every row,
    # each as saved (a table of room enough restores the same).
    kept, roomy = _full_table(1), HashTable(table_options(admission=False,
                                                          max_capacity=4 * FULL_CAPACITY))
    restore_checkpoint(path, None, None, {"t": kept}, keep_every_row=True)
    restore_checkpoint(path, None, None, {"t": roomy})
    assert int(kept.size()) == saved == int(roomy.size()) and kept.capacity() > FULL_CAPACITY
    want, got = snapshot(roomy), snapshot(kept)
    order_want, order_got = want["keys"].argsort(), got["keys"].argsort()
    for field in ("keys", "rows", "scores"):
        assert torch.equal(got[field][order_got], want[field][order_want])

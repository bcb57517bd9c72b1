"""Incremental dumps: exact deltas against a dict model, and full dump + deltas == table."""

from __future__ import annotations

import os

import pytest
import torch
from checkpoint_helpers import snapshot, table_options, train_steps

from hashrec.checkpoint import CheckpointError, IncrementalDumper, apply_deltas
from hashrec.checkpoint.layout import read_meta
from hashrec.checkpoint.restore import open_table_shards, restore_checkpoint
from hashrec.table import HashTable
from hashrec.tools.apply_delta import main as apply_delta_main

ROW_FIELDS = ("keys", "tags", "rows", "scores")


def _as_dict(snap: dict[str, torch.Tensor]) -> dict[tuple[int, int], tuple]:
    return {(int(k), int(t)): (tuple(r.tolist()), int(s))
            for k, t, r, s in zip(*(snap[f] for f in ROW_FIELDS))}


def _read_dump(path: str, name: str = "t") -> tuple[dict, set]:
    meta = read_meta(path)
    rows, evicted = {}, set()
    for reader in open_table_shards(path, meta, name):
        for chunk in reader.iter_chunks("rows"):
            rows.update(_as_dict(chunk))
        for chunk in reader.iter_chunks("evicted"):
            evicted.update(zip(chunk["keys"].tolist(), chunk["tags"].tolist()))
    return rows, evicted


def _small_table() -> HashTable:
    # Small capacity so that training evicts; tagged keys exercise identities.
    return HashTable(table_options(max_capacity=96))


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """Trains 15 steps, dumping every 3; returns (table, dump paths, states at dumps, dir)."""
    tmp_path = tmp_path_factory.mktemp("incremental")
    table = _small_table()
    dumper = IncrementalDumper(str(tmp_path / "dumps"), {"t": table}, interval_steps=3,
                               chunk_rows=10)
    paths, states = [], []
    for step in range(1, 16):
        train_steps(table, step, step, tagged=True)
        if step == 8:
            keys, tags, _, _ = next(table.export_state(5))
            table.erase(keys[:3], tags[:3])
        path = dumper.maybe_dump(step)
        if path is not None:
            paths.append(path)
            states.append(_as_dict(snapshot(table)))
    return table, paths, states, tmp_path


def test_dumps_on_the_interval(dumped):
    _, paths, _, _ = dumped
    assert [os.path.basename(p) for p in paths] == [
        f"dump-{s:012d}" for s in (1, 4, 7, 10, 13)]
    metas = [read_meta(p) for p in paths]
    assert [m["kind"] for m in metas] == ["full"] + ["delta"] * 4
    assert [m["base_step"] for m in metas] == [None, 1, 4, 7, 10]


def test_deltas_hold_exactly_changed_rows_and_evictions(dumped):
    _, paths, states, _ = dumped
    rows, evicted = _read_dump(paths[0])
    assert rows == states[0] and evicted == set()
    saw_eviction = saw_partial = False
    for path, before, after in zip(paths[1:], states, states[1:]):
        rows, evicted = _read_dump(path)
        changed = {k: v for k, v in after.items() if before.get(k) != v}
        assert rows == changed
        assert evicted == set(before) - set(after)
        saw_eviction |= bool(evicted)
        saw_partial |= 0 < len(rows) < len(after)
    assert saw_eviction and saw_partial


def test_full_dump_plus_deltas_reproduce_the_table(dumped):
    _, paths, states, tmp_path = dumped
    out = str(tmp_path / "applied")
    apply_deltas(paths[0], paths[1:], out, chunk_rows=7)
    restored = HashTable(table_options())
    meta = restore_checkpoint(out, None, None, {"t": restored})
    assert meta["step"] == 13 and meta["kind"] == "full"
    assert _as_dict(snapshot(restored)) == states[-1]  # the table at the last dump


def test_tool_applies_in_two_rounds_and_rejects_gaps(dumped, capsys):
    _, paths, states, tmp_path = dumped
    first = str(tmp_path / "round1")
    assert apply_delta_main(["--base", paths[0], "--delta", paths[1], "--delta", paths[2],
                             "--output", first]) == 0
    second = str(tmp_path / "round2")
    assert apply_delta_main(["--base", first, "--delta", paths[3], "--delta", paths[4],
                             "--output", second]) == 0
    assert _read_dump(second)[0] == states[-1]
    gap = str(tmp_path / "gap")
    assert apply_delta_main(["--base", paths[0], "--delta", paths[2], "--output", gap]) == 1
    assert "without gaps" in capsys.readouterr().err and not os.path.exists(gap)
    assert apply_delta_main(["--base", paths[0], "--delta", paths[1],
                             "--output", second]) == 1  # never overwritten


def test_dump_step_must_increase(tmp_path):
    dumper = IncrementalDumper(str(tmp_path), {"t": _small_table()}, interval_steps=1)
    dumper.dump(5)
    with pytest.raises(CheckpointError, match="not after"):
        dumper.dump(5)


@pytest.mark.parametrize("interval", [0, -2, True])
def test_bad_interval(tmp_path, interval):
    with pytest.raises(ValueError, match="interval_steps"):
        IncrementalDumper(str(tmp_path), {}, interval_steps=interval)

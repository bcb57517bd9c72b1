"""Incremental dumps: exact deltas against a dict model, and full dump + deltas == table."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from checkpoint_helpers import snapshot, table_options, train_steps

from hashrec.checkpoint import (
    CheckpointError,
    IncrementalDumper,
    apply_deltas,
    layout,
    save_checkpoint,
)
from hashrec.checkpoint.layout import read_meta
from hashrec.checkpoint.restore import open_table_shards, restore_checkpoint
from hashrec.checkpoint.shard_file import ShardWriter
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


def test_applied_dumps_carry_the_step_clock_and_drop_the_counters_of_admitted_keys(tmp_path):
    table = HashTable(table_options(max_capacity=4096))  # admission at 2
    dumper = IncrementalDumper(str(tmp_path / "dumps"), {"t": table}, interval_steps=3)
    dumps, clocks = [], {}
    for step in range(1, 8):
        train_steps(table, step, step, tagged=True)
        if step == 4:
            base = save_checkpoint(str(tmp_path / "model"), 4, None, None, {"t": table})
        path = dumper.maybe_dump(step)
        if path is not None:
            dumps.append(path)
            clocks[path] = int(table.step)
    assert [read_meta(p)["tables"]["t"]["table_step"] for p in dumps] == list(clocks.values())
    for applied, source, deltas in (("from_dump", dumps[0], dumps[1:]),
                                    ("from_checkpoint", base, dumps[2:])):
        out = apply_deltas(source, deltas, str(tmp_path / applied))
        restored = HashTable(table_options(max_capacity=4096))
        restore_checkpoint(out, None, None, {"t": restored})
        assert int(restored.step) == clocks[dumps[-1]] == 7
        if source == base:  # counters of the keys admitted since step 4 are dropped
            counted = _identities(restored.admission_state())
            at_base = HashTable(table_options(max_capacity=4096))
            restore_checkpoint(base, None, None, {"t": at_base})
            assert counted < _identities(at_base.admission_state())
            assert counted and not counted & _identities(next(restored.export_state(4096)))


def _identities(state) -> set[tuple[int, int]]:
    """(key, tag) pairs of an (keys, tags, ...) tuple."""
    return set(zip(state[0].tolist(), state[1].tolist()))


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


@pytest.mark.parametrize("where", ["below-a-file", "new-parent"])
def test_tool_output_below_a_file_is_one_error_line(dumped, capsys, tmp_path, where):
    _, paths, states, _ = dumped
    (tmp_path / "afile").write_text("")
    parent = tmp_path / ("afile" if where == "below-a-file" else "new")
    args = ["--base", paths[0], "--delta", paths[1], "--output", str(parent / "out")]
    if where == "new-parent":  # a missing parent folder is made
        assert apply_delta_main(args) == 0
        assert _read_dump(str(parent / "out"))[0] == states[1]
        return
    assert apply_delta_main(args) == 1
    assert capsys.readouterr().err == (f"apply_delta: cannot create {parent / 'out'}: Not a "
                                       f"directory; name a new path in a directory you can "
                                       f"write\n")
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_tool_failing_on_a_corrupt_delta_leaves_no_output(dumped, capsys, tmp_path):
    _, paths, _, _ = dumped
    delta = tmp_path / "dumps" / os.path.basename(paths[1])
    shutil.copytree(paths[1], delta)
    [data] = [os.path.join(d, f) for d, _, files in os.walk(delta) for f in files
              if f.endswith(".bin")]
    with open(data, "r+b") as f:  # the first array of the first chunk
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = tmp_path / "out"
    assert apply_delta_main(["--base", paths[0], "--delta", str(delta), "--output",
                             str(out)]) == 1
    assert capsys.readouterr().err.startswith(f"apply_delta: {data}: checksum mismatch")
    assert sorted(os.listdir(tmp_path)) == ["dumps"]  # neither out nor out.tmp


def test_tool_interrupted_leaves_no_output(dumped, capsys, tmp_path, monkeypatch):
    import hashrec.checkpoint.delta_apply as delta_apply

    _, paths, _, _ = dumped

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(delta_apply, "_write_shard", interrupted)
    assert apply_delta_main(["--base", paths[0], "--delta", paths[1], "--output",
                             str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err == "apply_delta: interrupted (no output written)\n"
    assert os.listdir(tmp_path) == []


def test_tool_says_which_dump_is_missing(dumped, capsys, tmp_path):
    _, paths, _, _ = dumped
    missing = os.path.join(os.path.dirname(paths[1]), "dump-000000000099")
    out = str(tmp_path / "out")
    assert apply_delta_main(["--base", paths[0], "--delta", missing, "--output", out]) == 1
    assert capsys.readouterr().err == f"apply_delta: {missing}: dump directory does not exist\n"
    assert apply_delta_main(["--base", missing, "--delta", paths[1], "--output", out]) == 1
    assert capsys.readouterr().err == f"apply_delta: {missing}: dump directory does not exist\n"
    assert not os.path.exists(out)


def test_dump_step_must_increase(tmp_path):
    dumper = IncrementalDumper(str(tmp_path), {"t": _small_table()}, interval_steps=1)
    dumper.dump(5)
    with pytest.raises(CheckpointError, match="not after"):
        dumper.dump(5)


@pytest.mark.parametrize("where", ["shard", "marker"])
def test_failed_dump_is_removed_and_says_the_disk_may_be_full(tmp_path, monkeypatch, where):
    table = _small_table()
    dumper = IncrementalDumper(str(tmp_path), {"t": table}, interval_steps=1)
    train_steps(table, 1, 2, tagged=True)
    dumper.dump(2)

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "shard":
        monkeypatch.setattr(ShardWriter, "write_chunk", no_space)
    else:  # the dump is renamed into place; its completion marker fails
        monkeypatch.setattr(layout, "write_marker", no_space)
    train_steps(table, 3, 4, tagged=True)
    with pytest.raises(CheckpointError, match=r"dump-000000000004.*No space left.*disk may be "
                                              r"full.*partial dump of step 4 was removed"):
        dumper.dump(4)
    assert os.listdir(tmp_path) == ["dump-000000000002"]
    monkeypatch.undo()
    # The dumper carries on from its last complete dump.
    path = dumper.dump(5)
    assert (read_meta(path)["kind"], read_meta(path)["base_step"]) == ("delta", 2)
    rows, _ = _read_dump(path)
    assert rows and set(rows.items()) <= set(_as_dict(snapshot(table)).items())


@pytest.mark.parametrize("interval", [0, -2, True])
def test_bad_interval(tmp_path, interval):
    with pytest.raises(ValueError, match="interval_steps"):
        IncrementalDumper(str(tmp_path), {}, interval_steps=interval)


def test_tool_refuses_a_delta_as_base(dumped, capsys):
    _, paths, _, tmp_path = dumped
    out = str(tmp_path / "delta-base")
    assert apply_delta_main(["--base", paths[1], "--delta", paths[2], "--output", out]) == 1
    assert "is a delta dump" in capsys.readouterr().err and not os.path.exists(out)


def _checkpoint_of(state_dir: str, model_dir: str, step: int) -> str:
    table = HashTable(table_options())
    restore_checkpoint(state_dir, None, None, {"t": table})
    return save_checkpoint(model_dir, step, None, None, {"t": table})


def test_checkpoint_base_must_be_at_the_deltas_base_step(dumped, capsys):
    _, paths, states, tmp_path = dumped
    at7 = str(tmp_path / "at7")
    apply_deltas(paths[0], paths[1:3], at7)
    ckpt7 = _checkpoint_of(at7, str(tmp_path / "ckpt7"), 7)
    out = str(tmp_path / "from-ckpt7")
    assert apply_delta_main(["--base", ckpt7, "--delta", paths[3], "--delta", paths[4],
                             "--output", out]) == 0
    assert _read_dump(out)[0] == states[-1]
    # A checkpoint after the delta's base step (or after the delta itself) is refused:
    # applying would roll rows back and label the result with the older step.
    later = _checkpoint_of(out, str(tmp_path / "ckpt13"), 13)
    for delta in (paths[2], paths[4]):
        bad = str(tmp_path / f"rollback-{os.path.basename(delta)}")
        assert apply_delta_main(["--base", later, "--delta", delta, "--output", bad]) == 1
        err = capsys.readouterr().err
        assert "is at step 13" in err and not os.path.exists(bad)


def test_base_of_another_model_is_refused(dumped, capsys):
    _, paths, _, tmp_path = dumped
    table = HashTable(table_options())
    other = save_checkpoint(str(tmp_path / "other"), 10, None, None, {"item": table})
    out = str(tmp_path / "other-out")
    assert apply_delta_main(["--base", other, "--delta", paths[4], "--output", out]) == 1
    err = capsys.readouterr().err
    assert "['t']" in err and "lacks" in err and not os.path.exists(out)


def test_model_dir_as_base_names_its_latest_checkpoint(dumped, capsys):
    _, paths, _, tmp_path = dumped
    model_dir = str(tmp_path / "model-dir")
    at7 = str(tmp_path / "at7-model-dir")
    apply_deltas(paths[0], paths[1:3], at7)
    _checkpoint_of(at7, model_dir, 7)
    out = str(tmp_path / "model-dir-out")
    assert apply_delta_main(["--base", model_dir, "--delta", paths[3], "--output", out]) == 1
    err = capsys.readouterr().err
    assert "is a model_dir" in err and "model.ckpt-7" in err and "latest_checkpoint()" not in err


def test_delta_and_base_with_different_tag_orders_are_refused(dumped, capsys):
    _, paths, _, tmp_path = dumped
    at7 = str(tmp_path / "at7-tags")
    apply_deltas(paths[0], paths[1:3], at7)
    table = HashTable(table_options())
    restore_checkpoint(at7, None, None, {"t": table})
    base = save_checkpoint(str(tmp_path / "tags-base"), 7, None, None, {"t": table},
                           tag_tables={"t": ["a", "b", "c"]})
    delta = str(tmp_path / "delta-tags")
    shutil.copytree(paths[3], delta)
    with open(os.path.join(delta, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    meta["tables"]["t"]["tag_tables"] = ["b", "a", "c"]
    with open(os.path.join(delta, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    out = str(tmp_path / "tags-out")
    assert apply_delta_main(["--base", base, "--delta", delta, "--output", out]) == 1
    assert "differently ordered" in capsys.readouterr().err and not os.path.exists(out)


def test_dumps_record_each_tags_table(tmp_path):
    table = _small_table()
    table.insert_or_assign(torch.arange(4), torch.ones(4, table.dim),
                           tags=torch.tensor([0, 1, 0, 1], dtype=torch.int32))
    dumper = IncrementalDumper(str(tmp_path), {"t": table}, 1, tag_tables={"t": ["a", "b"]})
    path = dumper.dump(1)
    meta = read_meta(path)
    assert meta["tables"]["t"]["tag_tables"] == ["a", "b"]
    (header,) = [json.load(open(os.path.join(root, name), encoding="utf-8"))
                 for root, _, names in os.walk(path) for name in names
                 if name.startswith("rank-") and name.endswith(".json")]
    assert header["attrs"]["tag_tables"] == ["a", "b"]

"""save_checkpoint: layout, marker last, pruning, re-saves and rejected inputs."""

from __future__ import annotations

import json
import os

import pytest
import torch
from checkpoint_helpers import assert_same, snapshot, table_options, trained_table

from hashrec.checkpoint import CheckpointError, latest_checkpoint, save_checkpoint
from hashrec.checkpoint.layout import complete_checkpoints
from hashrec.checkpoint.restore import restore_checkpoint
from hashrec.table import HashTable


def test_layout_and_meta(tmp_path):
    table = trained_table()
    path = save_checkpoint(str(tmp_path), 8, torch.nn.Linear(2, 2), None, {"user": table},
                           extra={"epoch": 3})
    assert path == str(tmp_path / "model.ckpt-8")
    names = sorted(os.listdir(path))
    assert names == ["DONE", "dynamicemb", "meta.json", "model.pt"]
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert meta["step"] == 8 and meta["world_size"] == 1 and meta["extra"] == {"epoch": 3}
    info = meta["tables"]["user"]
    assert (info["dim"], info["row_dim"]) == (table.dim, table.row_dim)
    assert info["optimizer"]["type"] == "SparseAdagrad"
    assert info["num_rows"] == table.size()
    assert os.path.isfile(os.path.join(path, info["shards"][0]["stem"] + ".bin"))


def test_missing_marker_is_never_latest(tmp_path):
    save_checkpoint(str(tmp_path), 1, None, None, {"t": trained_table(steps=2)})
    second = save_checkpoint(str(tmp_path), 2, None, None, {"t": trained_table(steps=3)})
    assert latest_checkpoint(str(tmp_path)) == second
    os.remove(os.path.join(second, "DONE"))
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1")
    with pytest.raises(CheckpointError, match="DONE: missing"):
        restore_checkpoint(second, None, None, {"t": HashTable(table_options())})


def test_latest_of_empty_or_missing_dir(tmp_path):
    assert latest_checkpoint(str(tmp_path)) is None
    assert latest_checkpoint(str(tmp_path / "absent")) is None


@pytest.mark.parametrize("keep", [0, 1, 2])
def test_keep_checkpoint_max_prunes_oldest(tmp_path, keep):
    table = trained_table(steps=2)
    for step in (10, 20, 30):
        save_checkpoint(str(tmp_path), step, None, None, {"t": table}, keep_checkpoint_max=keep)
    steps = [s for s, _ in complete_checkpoints(str(tmp_path))]
    assert steps == ([10, 20, 30] if keep == 0 else [10, 20, 30][-keep:])


def test_pruning_keeps_the_checkpoints_it_is_told_to_beside_the_latest(tmp_path):
    table = trained_table(steps=2)
    first = save_checkpoint(str(tmp_path), 10, None, None, {"t": table})
    for step in (20, 30, 40):
        save_checkpoint(str(tmp_path), step, None, None, {"t": table}, keep_checkpoint_max=2,
                        keep=[first])
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [10, 30, 40]
    # the one kept may be the latest itself: then it counts among keep_checkpoint_max
    last = save_checkpoint(str(tmp_path), 50, None, None, {"t": table}, keep_checkpoint_max=2,
                           keep=[os.path.join(str(tmp_path), "model.ckpt-50")])
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [40, 50] and os.path.isdir(last)


def test_pruning_never_deletes_the_new_checkpoint(tmp_path):
    table = trained_table(steps=2)
    save_checkpoint(str(tmp_path), 50, None, None, {"t": table})
    # An older step saved after a newer one is still kept: it was just written.
    path = save_checkpoint(str(tmp_path), 5, None, None, {"t": table}, keep_checkpoint_max=1)
    assert os.path.isdir(path)
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [5]


def test_same_step_saved_again_replaces_it(tmp_path):
    save_checkpoint(str(tmp_path), 4, None, None, {"t": trained_table(steps=2)})
    newer = trained_table(steps=5)
    path = save_checkpoint(str(tmp_path), 4, None, None, {"t": newer})
    restored = HashTable(table_options())
    restore_checkpoint(path, None, None, {"t": restored})
    assert_same(snapshot(restored), snapshot(newer))
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt-4"]


def test_stale_temp_dir_is_replaced(tmp_path):
    stale = tmp_path / "model.ckpt-3.tmp"
    stale.mkdir()
    (stale / "junk").write_text("x")
    path = save_checkpoint(str(tmp_path), 3, None, None, {"t": trained_table(steps=2)})
    assert not stale.exists() and latest_checkpoint(str(tmp_path)) == path


@pytest.mark.parametrize("bad", [
    {"step": -1}, {"extra": {"x": object()}}, {"tables": {"../escape": None}},
], ids=["negative-step", "extra-not-json", "table-name-path"])
def test_rejected_inputs_write_nothing(tmp_path, bad):
    tables = bad.get("tables", {"t": trained_table(steps=1)})
    with pytest.raises(CheckpointError):
        save_checkpoint(str(tmp_path), bad.get("step", 1), None, None, tables,
                        extra=bad.get("extra"))
    assert os.listdir(tmp_path) == []


def test_train_metrics_round_trip_read_only_when_asked(tmp_path):
    """Rank 0's train metric state goes to train_metrics.pt, checksummed in meta.json; a
    restore reads it only when asked, and a damaged one then names the file."""
    from hashrec.checkpoint.errors import CheckpointDamagedError

    state = {"version": 1, "metrics": {"auc": {"folds": 2, "window": [torch.arange(3.0)]}}}
    path = save_checkpoint(str(tmp_path), 5, None, None, {}, train_metrics=state)
    got = restore_checkpoint(path, None, None, {}, read_train_metrics=True)
    assert got["train_metrics"]["file"] == "train_metrics.pt"
    saved = got["train_metrics_state"]["metrics"]["auc"]
    assert saved["folds"] == 2 and torch.equal(saved["window"][0], torch.arange(3.0))
    assert restore_checkpoint(path, None, None, {})["train_metrics_state"] is None
    plain = save_checkpoint(str(tmp_path), 6, None, None, {})  # as checkpoints before
    assert restore_checkpoint(plain, None, None, {},
                              read_train_metrics=True)["train_metrics_state"] is None
    file = os.path.join(path, "train_metrics.pt")
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)
    restore_checkpoint(path, None, None, {})  # not read
    with pytest.raises(CheckpointDamagedError, match=f"{file}: .* bytes, meta.json says"):
        restore_checkpoint(path, None, None, {}, read_train_metrics=True)

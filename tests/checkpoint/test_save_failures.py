"""Saves that fail or are interrupted: full disks, abandoned and incomplete directories,
and a crash while the same step is saved again."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from checkpoint_helpers import assert_same, snapshot, table_options, trained_table

from hashrec.checkpoint import CheckpointError, dense, latest_checkpoint, save, save_checkpoint
from hashrec.checkpoint.layout import checkpoint_dirs, complete_checkpoints
from hashrec.checkpoint.restore import restore_checkpoint
from hashrec.checkpoint.shard_file import ShardWriter
from hashrec.table import HashTable


def _torch_save_fails_midway(state, f):
    f.write(b"x" * 1000)
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1000 vs 900")


def test_dense_file_on_a_full_disk_is_named_and_removed(tmp_path, monkeypatch):
    previous = save_checkpoint(str(tmp_path), 1, torch.nn.Linear(2, 2), None, {})
    monkeypatch.setattr(dense.torch, "save", _torch_save_fails_midway)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(str(tmp_path), 2, torch.nn.Linear(2, 2), None, {})
    message = str(info.value)
    assert os.path.join(str(tmp_path), "model.ckpt-2.tmp", "model.pt") in message
    assert "disk may be full" in message
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt-1"]
    assert latest_checkpoint(str(tmp_path)) == previous


def test_shard_on_a_full_disk_says_so_and_is_removed(tmp_path, monkeypatch):
    def no_space(self, section, arrays):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "write_chunk", no_space)
    with pytest.raises(CheckpointError, match=r"model\.ckpt-2\.tmp.*No space left.*disk may "
                                              r"be full"):
        save_checkpoint(str(tmp_path), 2, None, None, {"t": trained_table(steps=2)})
    assert os.listdir(tmp_path) == []


def test_abandoned_temp_dir_is_not_a_checkpoint(tmp_path):
    (tmp_path / "model.ckpt-10.tmp").mkdir()
    (tmp_path / "model.ckpt-10.tmp" / "model.pt").write_text("partial")
    assert checkpoint_dirs(str(tmp_path)) == []
    assert latest_checkpoint(str(tmp_path)) is None
    (tmp_path / "model.ckpt-20").mkdir()
    assert checkpoint_dirs(str(tmp_path)) == [str(tmp_path / "model.ckpt-20")]


@pytest.mark.parametrize("keep", [0, 2])
def test_next_save_removes_leftovers_of_interrupted_saves_and_prunes(tmp_path, keep):
    table = trained_table(steps=2)
    save_checkpoint(str(tmp_path), 10, None, None, {"t": table})
    pruned = save_checkpoint(str(tmp_path), 20, None, None, {"t": table})
    os.remove(os.path.join(pruned, "DONE"))  # a prune interrupted after the marker went
    os.makedirs(tmp_path / "model.ckpt-15" / "dynamicemb")  # emptied by a prune
    (tmp_path / "model.ckpt-5.tmp").mkdir()  # a save killed before its commit
    path = save_checkpoint(str(tmp_path), 30, None, None, {"t": table},
                           keep_checkpoint_max=keep)
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt-10", "model.ckpt-30"]
    assert latest_checkpoint(str(tmp_path)) == path


class _Crash(BaseException):
    """Stands for the process dying: no handler of the save runs."""


def _crash_at(monkeypatch, point: str) -> None:
    renames = []
    real_rename, real_rmtree = os.rename, save.shutil.rmtree

    def rename(src, dst):
        renames.append(dst)
        if point == "second-rename" and len(renames) == 2:
            raise _Crash()  # the old copy is aside, the new one not yet in place
        real_rename(src, dst)

    def rmtree(path, *args, **kwargs):
        if point == "removing-old-copy" and str(path).endswith(".replaced"):
            raise _Crash()
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(save.os, "rename", rename)
    monkeypatch.setattr(save.shutil, "rmtree", rmtree)


@pytest.mark.parametrize("point", ["second-rename", "removing-old-copy"])
def test_crash_while_saving_a_step_again_keeps_that_step(tmp_path, monkeypatch, point):
    save_checkpoint(str(tmp_path), 10, None, None, {"t": trained_table(steps=1)})
    first = trained_table(steps=3)
    save_checkpoint(str(tmp_path), 20, None, None, {"t": first})
    second = trained_table(steps=4)
    _crash_at(monkeypatch, point)
    with pytest.raises(_Crash):
        save_checkpoint(str(tmp_path), 20, None, None, {"t": second})
    monkeypatch.undo()
    assert os.path.isdir(tmp_path / "model.ckpt-20.replaced")
    expected = first if point == "second-rename" else second
    steps = [s for s, _ in complete_checkpoints(str(tmp_path))]
    assert steps == [10, 20]
    restored = HashTable(table_options())
    restore_checkpoint(latest_checkpoint(str(tmp_path)), None, None, {"t": restored})
    assert_same(snapshot(restored), snapshot(expected))
    # The next save puts the step's directories back in order.
    save_checkpoint(str(tmp_path), 30, None, None, {"t": second})
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt-10", "model.ckpt-20", "model.ckpt-30"]
    restored = HashTable(table_options())
    restore_checkpoint(str(tmp_path / "model.ckpt-20"), None, None, {"t": restored})
    assert_same(snapshot(restored), snapshot(expected))

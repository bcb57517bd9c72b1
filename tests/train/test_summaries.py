"""TensorBoard summaries: what TensorBoard reads back, and write failures that turn them off
with one warning instead of tracebacks."""

from __future__ import annotations

import builtins
import errno
import io
import logging
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hashrec.train import summaries
from hashrec.train.summaries import Summaries


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_tensorboard_reads_the_scalars_back(tmp_path):
    writer = Summaries(str(tmp_path), enabled=True)
    writer.scalars(10, {"loss": 0.5, "auc": 0.75}, prefix="eval/")
    writer.tables(20, {"deep": {"size": 3.0, "load": 0.25}})
    writer.close()
    events = EventAccumulator(str(tmp_path / "train"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/auc", "eval/loss", "table/deep/load",
                                                "table/deep/size"]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(10, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("table/deep/load")] == [(20, 0.25)]


def test_disabled_writes_nothing(tmp_path):
    writer = Summaries(str(tmp_path), enabled=False)
    writer.scalars(1, {"loss": 1.0})
    writer.close()
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_the_folder_goes_turns_summaries_off(tmp_path, caplog, capfd):
    (tmp_path / "train").write_text("mine")
    writer = Summaries(str(tmp_path), enabled=True)
    writer.scalars(1, {"loss": 1.0})
    writer.close()
    assert _warnings(caplog) == [f"TensorBoard summaries are off from now on: cannot write "
                                 f"{tmp_path / 'train'}: File exists"]
    assert "Traceback" not in capfd.readouterr().err
    assert (tmp_path / "train").read_text() == "mine"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_at_the_start_turns_summaries_off(tmp_path, caplog, capfd, monkeypatch):
    real_open = io.open

    def full_disk(file, mode="r", *args, **kwargs):
        # /dev/full fails every write with ENOSPC, as a full disk does.
        return real_open("/dev/full" if "tfevents" in str(file) else file, mode, *args,
                         **kwargs)

    monkeypatch.setattr(io, "open", full_disk)
    monkeypatch.setattr(builtins, "open", full_disk)
    writer = Summaries(str(tmp_path), enabled=True)
    writer.scalars(1, {"loss": 1.0})
    writer.close()
    (warning,) = _warnings(caplog)
    assert f"cannot write {tmp_path / 'train'}/events.out.tfevents." in warning
    assert warning.endswith("No space left on device; the disk may be full: free space and "
                            "run again")
    assert "Traceback" not in capfd.readouterr().err


class _FillingDisk:
    """``open`` of the summaries module: files whose writes fail with ENOSPC once ``full``
    is set, as on a disk that fills up."""

    def __init__(self) -> None:
        self.full = False

    def __call__(self, path, mode="r", *args, **kwargs):
        return _File(open(path, mode, *args, **kwargs), self)


class _File:
    def __init__(self, file, disk: _FillingDisk) -> None:
        self._file, self._disk = file, disk

    def _check(self) -> None:
        if self._disk.full:
            raise OSError(errno.ENOSPC, "No space left on device")

    def write(self, data: bytes) -> int:
        self._check()
        return self._file.write(data)

    def flush(self) -> None:
        self._check()
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def test_a_disk_that_fills_up_turns_summaries_off_and_keeps_what_was_written(
        tmp_path, caplog, capfd, monkeypatch):
    disk = _FillingDisk()
    monkeypatch.setattr(summaries, "open", disk, raising=False)
    writer = Summaries(str(tmp_path), enabled=True)
    writer.scalars(1, {"loss": 1.0})
    disk.full = True
    writer.scalars(2, {"loss": 0.9})
    writer.tables(2, {"deep": {"size": 3.0}})
    disk.full = False  # space again: the summaries stay off
    writer.scalars(3, {"loss": 0.8})
    writer.close()
    (warning,) = _warnings(caplog)
    assert warning.endswith("No space left on device; the disk may be full: free space and "
                            "run again")
    assert "Traceback" not in capfd.readouterr().err
    events = EventAccumulator(str(tmp_path / "train"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0)]

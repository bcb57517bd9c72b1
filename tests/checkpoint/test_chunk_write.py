import os
import signal
import time

import numpy as np
import pytest
import xxhash

from hashrec.checkpoint import chunk_write
from hashrec.checkpoint.chunk_write import start_writeback, write_chunk_arrays


def _arrays():
    rng = np.random.default_rng(0)
    return [rng.integers(-1 << 40, 1 << 40, 1000, dtype=np.int64),
            np.zeros(0, dtype=np.int32),
            rng.standard_normal(3000).astype(np.float32),
            np.arange(7, dtype=np.uint8)]


def _write(path, arrays, prefix=b""):
    with open(path, "wb", buffering=0) as f:
        f.write(prefix)
        digests = write_chunk_arrays(f, arrays)
    return digests, path.read_bytes()


def test_arrays_are_written_back_to_back_after_the_file_position(tmp_path):
    arrays = _arrays()
    digests, data = _write(tmp_path / "a.bin", arrays, prefix=b"head")
    assert data == b"head" + b"".join(a.tobytes() for a in arrays)
    assert digests == [xxhash.xxh3_64_hexdigest(a) for a in arrays]


def test_short_writes_are_resumed(tmp_path, monkeypatch):
    real = os.writev
    calls = []

    def at_most_100_bytes(fd, buffers):
        calls.append(len(buffers))
        return real(fd, [memoryview(buffers[0])[:100]])

    monkeypatch.setattr(os, "writev", at_most_100_bytes)
    arrays = _arrays()
    _, data = _write(tmp_path / "a.bin", arrays)
    assert data == b"".join(a.tobytes() for a in arrays)
    assert len(calls) > len(arrays)


def test_a_write_that_makes_no_progress_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "writev", lambda fd, buffers: 0)
    with pytest.raises(OSError, match="no progress"):
        _write(tmp_path / "a.bin", _arrays())


def test_without_writev_the_file_object_writes(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "writev")
    arrays = _arrays()
    digests, data = _write(tmp_path / "a.bin", arrays)
    assert data == b"".join(a.tobytes() for a in arrays)
    assert digests == [xxhash.xxh3_64_hexdigest(a) for a in arrays]


@pytest.mark.parametrize("available", [True, False], ids=["sync_file_range", "no_op"])
def test_start_writeback_leaves_the_data_unchanged(tmp_path, monkeypatch, available):
    if not available:
        monkeypatch.setattr(chunk_write, "_sync_file_range", lambda: None)
    path = tmp_path / "a.bin"
    with open(path, "wb", buffering=0) as f:
        f.write(b"x" * 10000)
        start_writeback(f.fileno(), 0, 10000)
        start_writeback(f.fileno(), 10000, 0)
        os.fsync(f.fileno())
    assert path.read_bytes() == b"x" * 10000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writes_with_its_own_threads(tmp_path):
    arrays = _arrays()
    _write(tmp_path / "parent.bin", arrays)  # the parent's threads exist now
    child_path = tmp_path / "child.bin"
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if the write finished with the right bytes
        try:
            _, data = _write(child_path, arrays)
            os._exit(0 if data == b"".join(a.tobytes() for a in arrays) else 1)
        except BaseException:  # noqa: BLE001 - reported through the exit status
            os._exit(2)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's write hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0

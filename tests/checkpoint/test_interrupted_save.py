"""A process killed in the middle of a save loses nothing: the previous checkpoint stays latest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import torch
from checkpoint_helpers import assert_same, snapshot, table_options, trained_table

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from hashrec.checkpoint.save import PAUSE_ENV
from hashrec.table import HashTable

_CHILD = textwrap.dedent("""
    import os, sys
    import torch
    from checkpoint_helpers import snapshot, train_steps, trained_table
    from hashrec.checkpoint import save_checkpoint

    model_dir, snapshot_path, pause_file = sys.argv[1:4]
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    table = trained_table(steps=5)
    save_checkpoint(model_dir, 5, model, optimizer, {"t": table})
    torch.save(snapshot(table), snapshot_path)
    train_steps(table, 6, 9)
    os.environ[sys.argv[4]] = pause_file
    save_checkpoint(model_dir, 9, model, optimizer, {"t": table})
""")


def _wait_for(path: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("child never reached the pause point")
        time.sleep(0.05)


def test_killed_save_keeps_previous_checkpoint(tmp_path):
    model_dir = str(tmp_path / "model")
    pause_file = str(tmp_path / "paused")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__), *sys.path]))
    env.pop(PAUSE_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, str(script), model_dir, str(tmp_path / "snap.pt"), pause_file,
         PAUSE_ENV], env=env, stderr=subprocess.PIPE)
    _wait_for(pause_file, proc)
    proc.kill()
    proc.wait()

    partial = os.path.join(model_dir, "model.ckpt-9.tmp")
    assert os.path.isdir(partial) and not os.path.exists(os.path.join(partial, "DONE"))
    assert not os.path.exists(os.path.join(model_dir, "model.ckpt-9"))
    latest = latest_checkpoint(model_dir)
    assert latest == os.path.join(model_dir, "model.ckpt-5")

    restored = HashTable(table_options())
    meta = restore_checkpoint(latest, torch.nn.Linear(2, 2), None, {"t": restored})
    assert meta["step"] == 5
    assert_same(snapshot(restored), torch.load(tmp_path / "snap.pt"))

    # Training resumes and the next save of the same step completes over the debris.
    path = save_checkpoint(model_dir, 9, None, None, {"t": trained_table(steps=9)})
    assert latest_checkpoint(model_dir) == path and not os.path.exists(partial)

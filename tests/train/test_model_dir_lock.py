"""One training run per model_dir: a second run is refused while the first holds it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
from small_din import CONFIG

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.train.errors import TrainError
from hashrec.train.model_dir_lock import LOCK_FILE, model_dir_lock
from hashrec.train.run import train_and_evaluate


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    model_dir = str(tmp_path / "m")
    with model_dir_lock(model_dir):
        with pytest.raises(TrainError, match=rf"model_dir '{model_dir}' is in use by another "
                                             rf"training run \(pid {os.getpid()} on .+, since "
                                             rf".+\); wait for it to end, or choose another"):
            with model_dir_lock(model_dir):
                pass
        with model_dir_lock(model_dir, held=False):  # the ranks other than the chief
            pass
    with model_dir_lock(model_dir):  # released
        pass
    assert os.listdir(model_dir) == [LOCK_FILE]


def test_train_and_evaluate_is_refused_while_another_process_trains_there(tmp_path):
    model_dir = tmp_path / "m"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from hashrec.train.model_dir_lock import model_dir_lock\n"
         f"with model_dir_lock({str(model_dir)!r}):\n"
         "    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        config = apply_edit_config_json(load_pipeline_config(CONFIG),
                                        {"model_dir": str(model_dir)})
        for continue_train in (False, True):
            with pytest.raises(TrainError, match=rf"is in use by another training run "
                                                 rf"\(pid {holder.pid} on "):
                train_and_evaluate(config, continue_train=continue_train)
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed holder leaves no lock behind
        holder.wait()
    with model_dir_lock(str(model_dir)):
        pass


def _sleep_after_start(started) -> None:
    started.set()
    time.sleep(60)


def test_a_forked_child_does_not_keep_the_lock_after_its_parent_lets_go(tmp_path):
    # A loader worker is forked while the chief holds the lock; a chief killed with
    # SIGKILL leaves such a worker alive for seconds, which must not hold the model_dir.
    model_dir = str(tmp_path / "m")
    context = multiprocessing.get_context("fork")
    started = context.Event()
    with model_dir_lock(model_dir):
        child = context.Process(target=_sleep_after_start, args=(started,), daemon=True)
        child.start()
        assert started.wait(30)
    try:
        with model_dir_lock(model_dir):  # the child is still alive
            assert child.is_alive()
    finally:
        child.kill()
        child.join()

"""One training run per model_dir: a second run is refused while the first holds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

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

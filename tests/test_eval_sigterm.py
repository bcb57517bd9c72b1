"""python -m hashrec.eval stopped by SIGTERM: one line and exit 143, as after a Ctrl-C,
and no result appended to eval_result.txt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")

# SIGTERM arrives while the checkpoint is evaluated, as a scheduler's stop would.
TERMINATED_EVAL = """
import os, signal, sys
import hashrec.train
from hashrec.eval import main
hashrec.train.evaluate_checkpoint = lambda *args, **kwargs: os.kill(os.getpid(),
                                                                    signal.SIGTERM)
sys.exit(main(sys.argv[1:]))
"""


def test_a_terminated_eval_is_one_line_and_writes_no_result(tmp_path):
    proc = subprocess.run([sys.executable, "-c", TERMINATED_EVAL, "--pipeline_config_path",
                           CONFIG, "--model_dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + int(signal.SIGTERM), proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "stopped by SIGTERM (no eval result written)")
    assert os.listdir(tmp_path) == []

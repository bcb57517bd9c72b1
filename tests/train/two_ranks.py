"""Training on two CPU ranks (gloo) for the tests of models whose dynamic tables are sharded
between the ranks: ``train_eval`` under torchrun, its evaluation results, and a gloo world of
two ranks (``dist_workers.run_world``) to restore the checkpoint in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "distributed"))
from dist_workers import free_port, run_world  # noqa: E402

__all__ = ["eval_results", "run_world", "torchrun_train_eval"]


def torchrun_train_eval(config_path, *args: str, timeout: int = 300
                        ) -> subprocess.CompletedProcess:
    """``hashrec.train_eval`` of ``config_path`` (and ``args``) under torchrun on two CPU
    ranks; it must end well, its dynamic tables planned for both ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "hashrec.train_eval", "--pipeline_config_path", str(config_path), *args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "storage plan for 2 rank(s)" in run.stderr, run.stderr[-4000:]
    return run


def eval_results(model_dir) -> list[dict]:
    """The evaluations ``<model_dir>/eval_result.txt`` holds, in order."""
    with open(os.path.join(model_dir, "eval_result.txt"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]

"""python -m hashrec.export stopped by SIGTERM: one line, exit 143, and neither export_dir
nor its staging directory left behind, as after a Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from export_helpers import ROOT, write_config

from hashrec.checkpoint import save_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.train.session import build_session

# SIGTERM arrives while the export writes its last file, as a scheduler's stop would.
TERMINATED_EXPORT = """
import os, signal, sys
import hashrec.export.exporter as exporter
from hashrec.export.__main__ import main
exporter.save_scripted = lambda *args: os.kill(os.getpid(), signal.SIGTERM)
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """A config whose model_dir holds an untrained checkpoint (dense tables only)."""
    root = tmp_path_factory.mktemp("export_signals")
    path = write_config(root, root / "data", root / "model", dynamic=False)
    session = build_session(load_pipeline_config(path), device=torch.device("cpu"))
    (root / "model").mkdir()
    save_checkpoint(str(root / "model"), 0, session.model, session.dense.optimizers, {})
    return path


def test_a_terminated_export_leaves_nothing(config, tmp_path):
    export_dir = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-c", TERMINATED_EXPORT, "--pipeline_config_path",
                           config, "--export_dir", str(export_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + int(signal.SIGTERM), proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "stopped by SIGTERM (nothing exported)")
    assert "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []  # neither export_dir nor export_dir.tmp

"""A ZCH model trained under torchrun on 2 CPU ranks: its checkpoint restores in one
process (same slots as the ranks held) and converts to dynamicemb."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from migration_helpers import dynamicemb_block, session_of, write_config, write_data, zch_block

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.tools.dynamicemb.zch_to_dynamicemb_convert import main as convert_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_zch_trains_on_two_ranks_and_converts(tmp_path):
    write_data(str(tmp_path / "data" / "part-0.parquet"), rows=640, seed=1)
    write_data(str(tmp_path / "data" / "part-1.parquet"), rows=640, seed=2)
    config = write_config(str(tmp_path / "zch.config"), zch_block(size=24, interval=3),
                          dynamicemb_block(), str(tmp_path / "m"), str(tmp_path / "data"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m",
           "hashrec.train_eval", "--pipeline_config_path", config,
           "--eval_input_path", str(tmp_path / "data"),
           "--edit_config_json", json.dumps({"train_config.num_epochs": 2})]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    with open(tmp_path / "m" / "eval_result.txt", encoding="utf-8") as f:
        (result,) = [json.loads(line) for line in f if line.strip()]
    assert result["num_examples"] == 1280

    checkpoint = latest_checkpoint(str(tmp_path / "m"))
    session = session_of(config)
    restore_checkpoint(checkpoint, session.model, None, session.model.embedding.dynamic_tables())
    remapper = session.model.embedding.zch_remappers["user_id"]
    keys, _, _, _ = remapper.assigned()
    assert keys.numel() == 24 and int(remapper.step) == result["step"]

    target = write_config(str(tmp_path / "dyn.config"), dynamicemb_block(), dynamicemb_block())
    assert convert_main(["--source_checkpoint_path", checkpoint,
                         "--source_pipeline_config_path", config,
                         "--target_pipeline_config_path", target,
                         "--save_dir", str(tmp_path / "c")]) == 0
    converted = session_of(target)
    restore_checkpoint(str(tmp_path / "c" / "model.ckpt-0"), converted.model, None,
                       converted.model.embedding.dynamic_tables(), restore_optimizer=False)
    stored = converted.model.embedding.dynamic_tables()
    assert sum(int(t.stats()["size"]) for t in stored.values()) >= 24

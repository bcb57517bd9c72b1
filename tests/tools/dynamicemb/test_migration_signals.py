"""The migration tools stopped by Ctrl-C or SIGTERM: one line, exit 130 / 143, and no
partial checkpoint left in --save_dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from migration_helpers import DIM, dynamicemb_block, write_config

# The signal arrives while the checkpoint's shards are opened (in CheckpointBuilder) or
# while rows are written into them; SIGINT gets Python's handler even where the test
# runner's shell ignores it.
STOPPED_TOOL = """
import os, signal, sys
import hashrec.tools.dynamicemb.ckpt_writer as ckpt_writer
from hashrec.tools.dynamicemb.create_dynamicemb_init_ckpt import main
signal.signal(signal.SIGINT, signal.default_int_handler)
signum, where = int(sys.argv.pop(1)), sys.argv.pop(1)
if where == "opening":
    opened = []
    shard_writer = ckpt_writer.ShardWriter
    def stop_at_the_second(*args, **kwargs):
        opened.append(shard_writer(*args, **kwargs))
        if len(opened) == 2:
            os.kill(os.getpid(), signum)
        return opened[-1]
    ckpt_writer.ShardWriter = stop_at_the_second
else:
    ckpt_writer.CheckpointBuilder.write_rows = lambda *args: os.kill(os.getpid(), signum)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum,where", [(signal.SIGINT, "opening"),
                                          (signal.SIGTERM, "writing")],
                         ids=["sigint-opening", "sigterm-writing"])
def test_a_stopped_tool_leaves_no_partial_checkpoint(tmp_path, signum, where):
    init = tmp_path / "init.parquet"
    ids = np.arange(5000, 5040, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "emb": [[0.5] * DIM] * len(ids)}), init)
    config = write_config(str(tmp_path / "c.config"), "num_buckets: 2000",
                          dynamicemb_block(str(init)))
    save_dir = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", STOPPED_TOOL, str(int(signum)), where,
                           "--pipeline_config_path", config, "--world_size", "2",
                           "--save_dir", str(save_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + int(signum), proc.stderr[-3000:]
    stopped = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert proc.stderr.strip().splitlines()[-1] == f"{stopped} (no checkpoint written)"
    assert "Traceback" not in proc.stderr
    assert os.listdir(save_dir) == []

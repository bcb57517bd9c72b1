"""The gloo test workers log their interpreted kernel launches for the compile check,
as the test process does (``tests/compile_check.py``): ``make test`` compiles those too."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from dist_workers import run_world  # noqa: E402


def scenario_rehash(ctx) -> int:  # noqa: ARG001 - a scenario's signature
    from hashrec.table.ops.rehash import triton as rehash_tt
    from hashrec.table.storage import TableStorage

    return rehash_tt.rehash(TableStorage.empty(2, 8, 2), 4 + ctx.rank * 2).num_buckets


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches are logged where interpreted")
def test_a_ranks_interpreted_launches_go_to_the_launch_log(tmp_path):
    log = tmp_path / "launches.jsonl"
    worlds = run_world({"rehash": scenario_rehash}, 2, str(tmp_path),
                       env={"HASHREC_LAUNCH_LOG": str(log)})
    assert worlds["rehash"] == [4, 6]
    kernels = {(e["module"], e["kernel"]) for e in map(json.loads, log.read_text().splitlines())}
    assert kernels == {("hashrec.table.ops.rehash.triton", "_split_kernel")}

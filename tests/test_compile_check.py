"""The kernel compile check fails on a launch the compiler refuses and passes the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(block: int) -> dict:
    tensor = ["tensor", "int64"]
    return {"module": "hashrec.embedding.ops.positions.triton", "kernel": "_rows_kernel",
            "args": [tensor] * 7 + [["value", 7], ["value", 5]],
            "kwargs": {"ORDER": ["value", False], "BLOCK": ["value", block]}}


def test_compile_check_reports_the_launch_that_does_not_compile(tmp_path):
    log = tmp_path / "launches.jsonl"
    # tl.arange needs a power-of-two range: BLOCK=1000 cannot compile, 1024 can.
    log.write_text("".join(json.dumps(_launch(b)) + "\n" for b in (1024, 1000)))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                            "HASHREC_FORCE_TRITON")}
    run = subprocess.run([sys.executable, "-m", "tests.compile_check", str(log), "--jobs", "1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and '"BLOCK": 1000' in failed[0], run.stdout
    assert "1 of 2 launches compile for sm_90" in run.stdout


def test_int_arguments_that_specialize_alike_compile_once():
    sys.path.insert(0, ROOT)
    from tests.compile_check import _int_class
    assert [_int_class(v) for v in (1, 32, 7, -1, 2 ** 40, 2 ** 40 + 3)] == \
        [1, 16, 3, 3, 2 ** 40, 2 ** 40 + 1]


def test_a_missing_log_is_an_error_without_a_gpu(tmp_path, monkeypatch):
    """Without a GPU the tests interpret kernels, so an empty log means none was logged;
    on a GPU they run compiled and log none."""
    sys.path.insert(0, ROOT)
    from tests.compile_check import main
    log = str(tmp_path / "launches.jsonl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        main([log])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main([log]) == 0


def test_launches_compile_with_the_gpu_launchers_specializations():
    """Aligned tensors and integers divisible by 16 carry tt.divisibility, an integer equal
    to 1 becomes a constant; an unaligned tensor and other integers carry nothing, nor do
    arguments the kernel does not specialize (the positions kernel's sizes). (In a
    process without the interpreter, as the check runs: this one may have imported the
    kernels interpreted.)"""
    tensor = ["tensor", "int64"]
    count = {"module": "hashrec.table.ops.export.triton", "kernel": "_count_kernel",
             "args": [["tensor", "uint8", True], tensor + [False], ["value", 48], ["value", 1]],
             "kwargs": {"BLOCK": ["value", 1024]}}
    other = {**count, "args": [["tensor", "uint8", True], tensor + [True], ["value", 7],
                               ["value", 3]]}
    rows = _launch(1024)
    rows["args"] = [tensor + [True]] * 7 + [["value", 48], ["value", 1]]
    script = (
        "import json, sys\n"
        "from tests.compile_check import _normalized, _source\n"
        "source, other, rows = (_source(_normalized(json.loads(a)))[0] for a in sys.argv[1:])\n"
        "print(json.dumps({'attrs': sorted(k[0] for k in source.attrs),\n"
        "                  'kinds': sorted({v[0][0] for v in source.attrs.values()}),\n"
        "                  'constant': source.constants.get((3,)),\n"
        "                  'start': other.signature['start'],\n"
        "                  'other_attrs': sorted(k[0] for k in other.attrs),\n"
        "                  'rows_attrs': sorted(k[0] for k in rows.attrs),\n"
        "                  'num_bags': rows.signature['num_bags']}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                            "HASHREC_FORCE_TRITON")}
    run = subprocess.run([sys.executable, "-c", script, json.dumps(count), json.dumps(other),
                          json.dumps(rows)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == {"attrs": [0, 2], "kinds": ["tt.divisibility"], "constant": 1,
                   "start": "i32", "other_attrs": [0, 1],
                   "rows_attrs": [0, 1, 2, 3, 4, 5, 6], "num_bags": "i32"}

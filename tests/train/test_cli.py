"""Command-line plumbing: user errors exit 1 with one line, other errors propagate."""

from __future__ import annotations

import argparse
import errno
import logging
import os

import pytest

from hashrec.embedding import EmbeddingError
from hashrec.export.errors import ExportError
from hashrec.table import TableFullError
from hashrec.train.cli import run_distributed, run_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")


def _raises(err: Exception):
    def main() -> None:
        raise err
    return main


@pytest.fixture(autouse=True)
def _config_loggers_restored():
    """setup_logging of a rank other than 0 quiets the config loggers: not past a test."""
    yield
    from hashrec.train.cli import CONFIG_LOGGERS

    for name in CONFIG_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.parametrize("err", [EmbeddingError("feature 'f': ids [7] are outside [0, 4)"),
                                 TableFullError("table 't': bucket full"),
                                 ExportError("scripted_model.pt does not exist")],
                         ids=["embedding", "table", "export"])
def test_user_errors_exit_1_with_one_message(caplog, err):
    with caplog.at_level(logging.ERROR):
        assert run_main(_raises(err)) == 1
    assert caplog.records[-1].getMessage() == f"{type(err).__name__}: {err}"


@pytest.mark.parametrize("err, message", [
    (PermissionError(errno.EACCES, "Permission denied", "/data/model/eval_result.txt"),
     "PermissionError: [Errno 13] Permission denied: '/data/model/eval_result.txt'"),
    (OSError(errno.ENOSPC, "No space left on device"),
     "OSError: [Errno 28] No space left on device; the disk may be full: free space and run "
     "again"),
], ids=["names-its-file", "full-disk"])
def test_file_system_errors_exit_1_with_one_message(caplog, err, message):
    with caplog.at_level(logging.ERROR):
        assert run_main(_raises(err)) == 1
    assert [r.getMessage() for r in caplog.records] == [message]


def test_an_os_error_of_no_file_propagates():
    with pytest.raises(BrokenPipeError):
        run_main(_raises(BrokenPipeError(errno.EPIPE, "Broken pipe")))


def test_other_errors_propagate():
    with pytest.raises(ZeroDivisionError):
        run_main(lambda: 1 / 0)


def test_unreadable_config_names_the_file_and_skips_the_body(caplog, tmp_path):
    path = str(tmp_path / "missing.config")
    args = argparse.Namespace(pipeline_config_path=path, edit_config_json=None)
    calls = []
    with caplog.at_level(logging.ERROR):
        code = run_distributed(args, {}, lambda config, ctx: calls.append(config))
    assert code == 1 and not calls
    assert "missing.config" in caplog.text


def test_a_run_stopped_by_a_signal_exits_128_plus_its_number(caplog):
    import signal

    from hashrec.train.interrupt import TrainInterrupted

    stop = TrainInterrupted("stopped by SIGTERM at step 3", signal.SIGTERM)
    with caplog.at_level(logging.WARNING):
        assert run_main(_raises(stop)) == 143
        assert run_main(_raises(KeyboardInterrupt())) == 130
    assert "stopped by SIGTERM at step 3" in caplog.text
    assert "interrupted" in caplog.text and "Traceback" not in caplog.text


def test_sigterm_raised_as_terminated_exits_143_saying_what_is_undone(caplog):
    from hashrec.train.interrupt import Terminated

    with caplog.at_level(logging.WARNING):
        assert run_main(_raises(Terminated()), interrupted="no predictions written") == 143
    assert caplog.records[-1].getMessage() == "stopped by SIGTERM (no predictions written)"


@pytest.mark.parametrize("module, target, args, undone", [
    ("hashrec.train_eval", "hashrec.train.train_and_evaluate", [],
     "the steps after the last checkpoint, if any, are not saved"),
    ("hashrec.eval", "hashrec.train.evaluate_checkpoint", [], "no eval result written"),
    ("hashrec.export.__main__", "hashrec.export.exporter.export_model",
     ["--export_dir", "unused"], "nothing exported"),
], ids=["train_eval", "eval", "export"])
def test_ctrl_c_says_what_the_command_left_undone(caplog, monkeypatch, module, target, args,
                                                  undone):
    import importlib

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    main = importlib.import_module(module).main
    with caplog.at_level(logging.WARNING):
        assert main(["--pipeline_config_path", CONFIG, *args]) == 130
    assert caplog.records[-1].getMessage() == f"interrupted ({undone})"



@pytest.mark.parametrize("err, says", [
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 8000ms for "
                  "send operation to complete"),
     "DistributedError: rank 0: a collective waited 8 s (HASHREC_COLLECTIVE_TIMEOUT_S) for "
     "another rank that did not answer ([gloo/transport/tcp/unbound_buffer.cc:129] Timed out"),
    (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"),
     "DistributedError: rank 0: a collective failed because another rank is gone ([gloo/"),
], ids=["timed-out", "peer-gone"])
def test_a_failed_collective_under_several_ranks_exits_1_with_one_line(caplog, monkeypatch,
                                                                        err, says):
    """A peer that hangs fails this rank's collective after HASHREC_COLLECTIVE_TIMEOUT_S:
    one error line, as for a peer that is gone, not gloo's traceback."""
    import torch

    from hashrec.distributed import DistContext
    from hashrec.train import cli

    ctx = DistContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"),
                      is_main=True, backend="gloo", owns_group=True)
    exits = []
    monkeypatch.setattr(cli, "distributed_context", lambda: ctx)
    monkeypatch.setattr(cli, "load_effective_config", lambda args, overrides: None)
    monkeypatch.setattr(cli.os, "_exit", exits.append)
    monkeypatch.setenv("HASHREC_COLLECTIVE_TIMEOUT_S", "8")

    def body(config, ctx):
        raise err

    with caplog.at_level(logging.ERROR):
        cli.run_distributed(argparse.Namespace(), {}, body)
    assert exits == [1]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(says) and "Traceback" not in caplog.text


@pytest.mark.parametrize("rank", [0, 1])
def test_the_configs_warnings_come_from_rank_0_alone(caplog, monkeypatch, tmp_path, rank):
    """Every rank loads the same config: its ignored fields are named once, not per rank."""
    import torch

    import hashrec.distributed
    from hashrec.distributed import DistContext
    from hashrec.train import cli

    path = tmp_path / "pipeline.config"
    with open(CONFIG, encoding="utf-8") as f:
        path.write_text(f.read().replace("train_config {", "train_config {\n  is_profiling: true",
                                         1))
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"),
                      is_main=rank == 0, backend="gloo", owns_group=True)
    monkeypatch.setattr(cli, "distributed_context", lambda: ctx)
    monkeypatch.setattr(hashrec.distributed, "teardown", lambda ctx: None)
    monkeypatch.setattr(cli.os, "_exit", lambda code: None)
    args = argparse.Namespace(pipeline_config_path=str(path), edit_config_json=None)
    with caplog.at_level(logging.WARNING, logger="hashrec"):
        cli.run_distributed(args, {}, lambda config, ctx: None)
    warned = [m for m in caplog.messages if "HashRec ignores train_config.is_profiling" in m]
    assert len(warned) == (1 if rank == 0 else 0)


@pytest.mark.parametrize("rank", [0, 1])
def test_feature_warnings_of_the_config_come_from_rank_0_alone(caplog, rank):
    """The feature layer's warnings restate the config, the same on every rank."""
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set
    from hashrec.train import cli

    with open(CONFIG, encoding="utf-8") as f:
        text = f.read().replace('{ mode: "NORMAL"; std_dev: 0.05 }',
                                '{ mode: "NORMAL"; std_dev: 0.05; lower: -1 }', 1)
    cli.setup_logging(rank, 2)
    with caplog.at_level(logging.WARNING, logger="hashrec"):
        build_feature_set(parse_pipeline_config(text))
    warned = [m for m in caplog.messages if "mode NORMAL does not read lower" in m]
    assert len(warned) == (1 if rank == 0 else 0)

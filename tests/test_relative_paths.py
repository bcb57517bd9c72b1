"""Integration: a config's relative paths are looked up from the working directory; when
one is not found there, the error says where it was looked for."""

from __future__ import annotations

import logging
import os

import pytest

from hashrec import eval as eval_cli
from hashrec import train_eval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")


@pytest.mark.parametrize("command,error", [
    (train_eval, "DataError: input path 'data/taobao/train' does not exist"),
    (eval_cli, "TrainError: checkpoint path 'experiments/multi_tower_din_taobao_dynamicemb' "
               "does not exist"),
], ids=["train_eval", "eval"])
def test_a_relative_path_not_found_names_the_working_directory(tmp_path, monkeypatch, caplog,
                                                               command, error):
    monkeypatch.chdir(tmp_path)  # the example's data/ and experiments/ are not here
    with caplog.at_level(logging.ERROR):
        assert command.main(["--pipeline_config_path", CONFIG]) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"{error} (relative to the working directory {tmp_path})"]


def test_an_absolute_path_not_found_is_named_alone(tmp_path, caplog):
    missing = tmp_path / "nowhere"
    with caplog.at_level(logging.ERROR):
        assert eval_cli.main(["--pipeline_config_path", CONFIG, "--checkpoint_path",
                              str(missing)]) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"TrainError: checkpoint path {str(missing)!r} does not exist"]

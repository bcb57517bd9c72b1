"""Integration: a misspelt column (a label field, a feature's expression) stops train_eval
with one error line naming the file and the closest column the file has."""

from __future__ import annotations

import json
import logging
import os

import pytest

from hashrec import train_eval
from hashrec.tools.gen_taobao_data import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("typos")
    generate(str(out), 600, seed=1, scale=0.001, quiet=True)
    return out


@pytest.mark.parametrize("edit,column,close", [
    ({"data_config.label_fields": ["click"]}, "click", "clk"),
    ({"feature_configs[feature_name=user_id].id_feature.expression": "user:usr_id"},
     "usr_id", "user_id"),
], ids=["label", "expression"])
def test_a_misspelt_column_names_the_closest(data, tmp_path, caplog, edit, column, close):
    edits = {"data_config.num_workers": 0, "eval_input_path": "", **edit}
    with caplog.at_level(logging.ERROR):
        code = train_eval.main(["--pipeline_config_path", CONFIG, "--model_dir",
                                str(tmp_path / "model"), "--train_input_path", str(data),
                                "--edit_config_json", json.dumps(edits)])
    assert code == 1
    [message] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert message.startswith(f"DataError: {data / 'part-00000.parquet'}: column {column!r} "
                              f"is missing (the file has [")
    assert message.endswith(f"]); did you mean {close!r}?")
    assert not [n for n in os.listdir(tmp_path / "model") if n.startswith("model.ckpt")]

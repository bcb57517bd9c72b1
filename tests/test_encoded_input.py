"""Integration: training on the raw input encoded by ``encode_input`` (fg_mode FG_NONE)
learns exactly what training on the raw input does."""

from __future__ import annotations

import pytest

from hashrec.config import load_pipeline_config
from hashrec.tools.encode_input import encode
from hashrec.tools.gen_taobao_data import generate
from tests.test_train_eval import CONFIG, EDITS, eval_results, run

pytestmark = pytest.mark.slow

SMALL = {**EDITS, "train_config.num_epochs": 1, "train_config.incremental_dump_steps": 0}


def test_encoded_input_trains_the_same_model(tmp_path):
    data = tmp_path / "raw"
    generate(str(data), 6000, seed=5, scale=0.001, eval_rows=2000, quiet=True)
    for split in ("train", "eval"):
        encode(load_pipeline_config(CONFIG), str(data / split),
               str(tmp_path / "encoded" / split), quiet=True)
    aucs = {}
    for kind, edits in (("raw", SMALL), ("encoded", {**SMALL,
                                                     "data_config.fg_mode": "FG_NONE"})):
        model_dir = tmp_path / f"model_{kind}"
        root = data if kind == "raw" else tmp_path / "encoded"
        proc = run("hashrec.train_eval", "--pipeline_config_path", CONFIG,
                   "--model_dir", str(model_dir), "--train_input_path", str(root / "train"),
                   "--eval_input_path", str(root / "eval"), edits=edits)
        assert proc.returncode == 0, proc.stderr[-3000:]
        aucs[kind] = eval_results(model_dir)[-1]["auc"]
        if kind == "encoded":
            assert "reads the column named as the feature" in proc.stderr
    assert aucs["encoded"] == aucs["raw"]

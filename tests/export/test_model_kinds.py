"""Integration: every ranking model through train_eval, evaluation, export and predict.

Small generated Taobao-like data; each model trains for one epoch on the CPU with
the train_eval command line, its checkpoint is evaluated again and exported, and
the exported model's predictions must equal the restored eager model's. Evaluation,
export and prediction run in this process (the functions the commands run) to keep
each model to a few seconds; ``tests/test_train_eval.py`` and ``test_exporter.py``
run those command lines.
"""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
import torch
from export_helpers import eval_predictions
from export_helpers import run as run_module
from model_kinds import MODELS, SUFFIX, pipeline_text

from hashrec.checkpoint import latest_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.tools.gen_taobao_data import generate
from hashrec.train import evaluate_checkpoint

pytestmark = pytest.mark.slow


def run(module: str, *args: str):
    proc = run_module(module, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), 600, seed=4, scale=0.01, eval_rows=300, quiet=True)
    return out


def write_config(directory, data_dir, model: str) -> str:
    path = os.path.join(str(directory), f"{model}.config")
    with open(path, "w", encoding="utf-8") as f:
        f.write(pipeline_text(model, data_dir, f"{directory}/model"))
    return path


def eval_results(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "eval_result.txt"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_trains_evaluates_exports_and_predicts_like_eval(model, data_dir, tmp_path):
    config_path = write_config(tmp_path, data_dir, model)
    run("hashrec.train_eval", "--pipeline_config_path", config_path)
    trained = eval_results(tmp_path / "model")[-1]
    auc = "auc" + SUFFIX.get(model, "")
    assert 0.0 <= trained[auc] <= 1.0 and trained["step"] == 5  # 600 rows / 128
    config = load_pipeline_config(config_path)
    checkpoint = latest_checkpoint(str(tmp_path / "model"))
    again = evaluate_checkpoint(config, checkpoint)
    assert again[auc] == pytest.approx(trained[auc], abs=1e-9)
    assert again["loss"] == pytest.approx(trained["loss"], rel=1e-5)

    export_model(config, str(tmp_path / "export"), checkpoint)
    predict(str(tmp_path / "export"), str(data_dir / "eval"), str(tmp_path / "pred.parquet"))
    written = pq.read_table(tmp_path / "pred.parquet")
    probs = torch.from_numpy(written["probs" + SUFFIX.get(model, "")].to_numpy())
    expected = eval_predictions(config_path, checkpoint, str(data_dir / "eval")).float()
    assert probs.shape == expected.shape == (300,)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)

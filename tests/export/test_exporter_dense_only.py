"""A model whose tables are all dense (num_buckets / hash_bucket_size) exports the same way."""

from __future__ import annotations

import json

import pytest
import torch
from export_helpers import eval_predictions, run, write_config
from safetensors import safe_open

from hashrec.checkpoint import save_checkpoint
from hashrec.config import load_pipeline_config
from hashrec.data import create_dataloader
from hashrec.export.loading import model_inputs
from hashrec.tools.gen_taobao_data import generate
from hashrec.train.session import build_session

pytestmark = pytest.mark.slow


def test_dense_only_model_exports_and_predicts_like_eval(tmp_path):
    generate(str(tmp_path / "data"), 300, seed=2, scale=0.01, eval_rows=200, quiet=True)
    config_path = write_config(tmp_path, tmp_path / "data", tmp_path / "model", dynamic=False)
    session = build_session(load_pipeline_config(config_path), device=torch.device("cpu"))
    assert session.model.embedding.dynamic_tables() == {}
    (tmp_path / "model").mkdir()
    checkpoint = save_checkpoint(str(tmp_path / "model"), 0, session.model,
                                 session.dense.optimizers, {})
    proc = run("hashrec.export", "--pipeline_config_path", config_path, "--export_dir",
               str(tmp_path / "export"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    with open(tmp_path / "export" / "model-000000-of-000001.json", encoding="utf-8") as f:
        entries = json.load(f)
    assert not any(e["is_hashmap"] for e in entries.values())
    rows = session.model.embedding.dense_tables["user_id"].rows
    with safe_open(str(tmp_path / "export" / "model-000000-of-000001.safetensors"), "pt") as p:
        assert entries["user_id"]["shape"] == [5000, 8]
        assert torch.equal(p.get_tensor(entries["user_id"]["name"]), rows[:, :8])

    model = torch.jit.load(str(tmp_path / "export" / "scripted_model.pt"))
    batches = create_dataloader(session.config.data_config, session.feature_set,
                                str(tmp_path / "data" / "eval"), "predict", batch_size=64)
    probs = torch.cat([model(*model_inputs(b, set()))["probs"] for b in batches])
    expected = eval_predictions(config_path, checkpoint, str(tmp_path / "data" / "eval"))
    torch.testing.assert_close(probs, expected.float(), atol=1e-5, rtol=0)

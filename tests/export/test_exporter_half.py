"""Tables of data_type FP16 / BF16 export in that dtype and predict like eval, in float32."""

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

# dynamic: user_id, adgroup_id (fused), cate_id; dense: cms_segid, pid.
DATA_TYPES = {"user_id": "FP16", "adgroup_id": "FP16", "cate_id": "BF16", "cms_segid": "BF16",
              "pid": "FP16"}
DTYPES = {"FP16": torch.float16, "BF16": torch.bfloat16}


def _trained(session, data: str, steps: int = 3):
    """A few training steps: keys pass admission and the rows move."""
    session.model.train()
    for step, batch in enumerate(session.loader(data, "train")):
        if step == steps:
            break
        loss = sum(session.model.loss(session.model(batch), batch).values())
        loss.backward()
    return session


def test_half_tables_export_in_their_dtype_and_predict_like_eval(tmp_path):
    generate(str(tmp_path / "data"), 600, seed=3, scale=0.01, eval_rows=200, quiet=True)
    config_path = write_config(tmp_path, tmp_path / "data", tmp_path / "model",
                               data_types=DATA_TYPES)
    session = _trained(build_session(load_pipeline_config(config_path),
                                     device=torch.device("cpu")), str(tmp_path / "data/train"))
    embedding = session.model.embedding
    (tmp_path / "model").mkdir()
    checkpoint = save_checkpoint(str(tmp_path / "model"), 3, session.model,
                                 session.dense.optimizers, embedding.dynamic_tables())
    proc = run("hashrec.export", "--pipeline_config_path", config_path, "--export_dir",
               str(tmp_path / "export"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    with open(tmp_path / "export" / "model-000000-of-000001.json", encoding="utf-8") as f:
        entries = json.load(f)
    assert {name: entries[name]["dtype"] for name in DATA_TYPES} == {
        name: str(DTYPES[t]).removeprefix("torch.") for name, t in DATA_TYPES.items()}
    with safe_open(str(tmp_path / "export" / "model-000000-of-000001.safetensors"), "pt") as p:
        for name, data_type in DATA_TYPES.items():
            values = p.get_tensor(entries[name]["name"])
            assert values.dtype == DTYPES[data_type] and values.shape[0] > 0, name
        rows = embedding.dense_tables["cms_segid"].rows
        assert torch.equal(p.get_tensor(entries["cms_segid"]["name"]), rows[:, :8])

    model = torch.jit.load(str(tmp_path / "export" / "scripted_model.pt"))
    tables = {buf.dtype for name, buf in model.named_buffers() if name.endswith(".values")}
    assert tables == {torch.float16, torch.bfloat16}  # kept at their size
    batches = create_dataloader(session.config.data_config, session.feature_set,
                                str(tmp_path / "data" / "eval"), "predict", batch_size=64)
    probs = torch.cat([model(*model_inputs(b, set()))["probs"] for b in batches])
    assert probs.dtype == torch.float32
    expected = eval_predictions(config_path, checkpoint, str(tmp_path / "data" / "eval"))
    torch.testing.assert_close(probs, expected.float(), atol=1e-5, rtol=0)

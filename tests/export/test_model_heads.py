"""Every model kind's inference model (tables as tensors, the scripted dense head)
predicts what the eager model predicts in eval mode."""

from __future__ import annotations

import pytest
import torch
from model_kinds import MODELS, SUFFIX, pipeline_text

from hashrec.config import parse_pipeline_config
from hashrec.export.loading import model_inputs
from hashrec.export.scripted import build_inference_model
from hashrec.export.tables import dynamic_table_views
from hashrec.tools.gen_taobao_data import generate
from hashrec.train.session import build_session


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), 200, seed=6, scale=0.01, eval_rows=100, quiet=True)
    return out


def _hashmaps(model) -> tuple[dict, dict]:
    hashmaps, missing = {}, {}
    for view in dynamic_table_views(model.embedding):
        keys = torch.cat([k for k, _ in view.chunks(64)])
        values = torch.cat([v for _, v in view.chunks(64)])
        order = keys.argsort()
        hashmaps[view.name] = (keys[order], values[order])
        missing[view.name] = view.missing_value()
    return hashmaps, missing


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_scripted_inference_model_equals_eager_eval(kind, data_dir, tmp_path):
    config = parse_pipeline_config(pipeline_text(kind, data_dir, tmp_path / "model"))
    torch.manual_seed(0)
    session = build_session(config, device=torch.device("cpu"))
    model = session.model
    batches = list(session.loader(str(data_dir / "eval"), "eval"))
    model.train()
    for batch in batches:  # inserts the ids into the dynamic tables, trains BatchNorm stats
        model(batch)
    model.eval()
    hashmaps, missing = _hashmaps(model)
    assert hashmaps and all(keys.numel() > 0 for keys, _ in hashmaps.values())
    scripted = torch.jit.script(build_inference_model(model, session.feature_set, hashmaps,
                                                      missing))
    weighted = {f.input_key for f in session.feature_set.embedding_features() if f.weighted}
    with torch.no_grad():
        for batch in batches:
            expected = model(batch)
            got = scripted(*model_inputs(batch, weighted))
            assert set(got) == set(expected)
            logits, probs = "logits" + SUFFIX.get(kind, ""), "probs" + SUFFIX.get(kind, "")
            torch.testing.assert_close(got[logits], expected[logits], atol=1e-5, rtol=0)
            torch.testing.assert_close(got[probs], expected[probs], atol=1e-6, rtol=0)

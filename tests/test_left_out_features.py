"""Integration: features that no feature group names are neither read nor embedded.

The train_eval, eval, export and predict command lines run on a config with an
ungrouped dynamicemb feature and an ungrouped num_buckets one: no table of theirs in
the checkpoint or the export, and their columns are not needed. A run of the older
behaviour (those features embedded: ``build_feature_set(..., keep=...)``) gives the
checkpoint and export that such versions wrote; both still restore and predict.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys

import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "export"))

from export_helpers import config_text, eval_predictions, run  # noqa: E402

from hashrec.checkpoint import latest_checkpoint  # noqa: E402
from hashrec.config import load_pipeline_config  # noqa: E402
from hashrec.export import export_model  # noqa: E402
from hashrec.features import build_feature_set  # noqa: E402
from hashrec.predict import predict  # noqa: E402
from hashrec.tools.gen_taobao_data import generate  # noqa: E402
from hashrec.train.run import train_and_evaluate  # noqa: E402

pytestmark = pytest.mark.slow

LEFT_OUT = ("brand", "age_level")
LEFT_OUT_CONFIGS = """
feature_configs { id_feature { feature_name: "brand" expression: "item:brand"
  embedding_dim: 8 dynamicemb { max_capacity: 20000 } } }
feature_configs { id_feature { feature_name: "age_level" expression: "user:age_level"
  num_buckets: 8 embedding_dim: 8 } }
"""
EVAL_ROWS = 500


def write_config(root, data, name: str) -> str:
    """The export tests' MultiTowerDIN config plus the two ungrouped features."""
    text = config_text().replace("model_config {", LEFT_OUT_CONFIGS + "model_config {", 1)
    path = root / f"{name}.config"
    path.write_text(f'train_input_path: "{data}/train"\neval_input_path: "{data}/eval"\n'
                    f'model_dir: "{root / name}"\n{text}')
    return str(path)


def table_names(checkpoint: str) -> set[str]:
    """Every dynamic storage and table a checkpoint's meta.json names."""
    with open(os.path.join(checkpoint, "meta.json"), encoding="utf-8") as f:
        tables = json.load(f)["tables"]
    return set(tables).union(*(t.get("tag_tables") or () for t in tables.values()))


def dense_state_keys(checkpoint: str) -> list[str]:
    return list(torch.load(os.path.join(checkpoint, "model.pt"), weights_only=True))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("left_out_data")
    generate(str(out), 2000, seed=6, scale=0.01, eval_rows=EVAL_ROWS, quiet=True)
    return out


@pytest.fixture(scope="module")
def flow(tmp_path_factory, data):
    """Command lines on the config: train_eval, eval, export, and predict on eval rows
    without the left-out features' columns."""
    root = tmp_path_factory.mktemp("left_out")
    config = write_config(root, data, "new")
    logs = {}
    for module, args in (
            ("hashrec.train_eval", ()),
            ("hashrec.eval", ()),
            ("hashrec.export", ("--export_dir", str(root / "export")))):
        proc = run(module, "--pipeline_config_path", config, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs[module] = proc.stderr
    bare = root / "bare"
    bare.mkdir()
    eval_table = pq.read_table(data / "eval")
    pq.write_table(eval_table.drop_columns(list(LEFT_OUT)), bare / "part-00000.parquet")
    proc = run("hashrec.predict", "--scripted_model_path", str(root / "export"),
               "--predict_input_path", str(bare), "--predict_output_path",
               str(root / "pred.parquet"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "data": data, "config": config, "logs": logs,
            "checkpoint": latest_checkpoint(str(root / "new"))}


@pytest.fixture(scope="module")
def older(tmp_path_factory, data):
    """A checkpoint and an export of a run that embedded the left-out features."""
    root = tmp_path_factory.mktemp("left_out_older")
    path = write_config(root, data, "older")
    config = load_pipeline_config(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hashrec.train.session.build_feature_set",
                      functools.partial(build_feature_set, keep=LEFT_OUT))
        train_and_evaluate(config)
        export_model(config, str(root / "export"))
        checkpoint = latest_checkpoint(str(root / "older"))
        probs = eval_predictions(path, checkpoint, str(data / "eval"))
    return {"root": root, "data": data, "config": path, "checkpoint": checkpoint,
            "probs": probs}


def test_no_table_of_a_left_out_feature_is_trained_or_exported(flow):
    assert "features in no feature group, left out (not read from the input, not " \
           "embedded, no table of their own): brand, age_level;" \
           in flow["logs"]["hashrec.train_eval"]
    assert {"user_id", "adgroup_id", "cate_id"} <= table_names(flow["checkpoint"])
    assert not table_names(flow["checkpoint"]) & set(LEFT_OUT)
    keys = dense_state_keys(flow["checkpoint"])
    assert any(".cms_segid." in k for k in keys)
    assert not [k for k in keys if any(f".{name}." in k for name in LEFT_OUT)]
    with open(flow["root"] / "export" / "model-000000-of-000001.json", encoding="utf-8") as f:
        exported = json.load(f)
    assert not [k for k in exported if any(name in k for name in LEFT_OUT)]


def test_eval_and_predict_need_no_left_out_column(flow):
    with open(flow["root"] / "new" / "eval_result.txt", encoding="utf-8") as f:
        results = [json.loads(line) for line in f if line.strip()]
    assert 0.0 < results[-1]["auc"] < 1.0
    probs = torch.from_numpy(pq.read_table(flow["root"] / "pred.parquet")["probs"].to_numpy())
    expected = eval_predictions(flow["config"], flow["checkpoint"],
                                str(flow["data"] / "eval")).float()
    assert probs.shape == (EVAL_ROWS,)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)


def test_a_checkpoint_with_left_out_tables_restores_without_them(older, caplog):
    assert set(LEFT_OUT) <= table_names(older["checkpoint"]) | {
        k.split(".")[2] for k in dense_state_keys(older["checkpoint"])
        if k.startswith("embedding.dense_tables.")}
    with caplog.at_level(logging.WARNING, logger="hashrec.checkpoint.restore"):
        probs = eval_predictions(older["config"], older["checkpoint"],
                                 str(older["data"] / "eval"))
    assert "holds tables that no feature of the model reads, not restored: 'brand' " \
           "(dynamic), 'age_level'." in caplog.text
    torch.testing.assert_close(probs, older["probs"], atol=1e-6, rtol=0)


def test_an_export_looking_up_left_out_features_still_predicts(older, tmp_path, caplog):
    data = str(older["data"] / "eval")
    with caplog.at_level(logging.INFO, logger="hashrec.predict"):
        out = predict(str(older["root"] / "export"), data, str(tmp_path / "older.parquet"))
    assert out["rows"] == EVAL_ROWS
    assert "looks up features that no feature group names (it was exported by a version " \
           "that embedded them): brand, age_level;" in caplog.text
    # The same checkpoint exported now, without those tables, predicts the same.
    export_model(load_pipeline_config(older["config"]), str(tmp_path / "export"),
                 older["checkpoint"])
    again = predict(str(tmp_path / "export"), data, str(tmp_path / "again.parquet"))
    probs = [torch.from_numpy(pq.read_table(o["output"])["probs"].to_numpy())
             for o in (out, again)]
    torch.testing.assert_close(probs[1], probs[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(probs[0], older["probs"].float(), atol=1e-5, rtol=0)

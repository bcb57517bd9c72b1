"""Integration: training on input a feature generation encoded (fg_mode FG_NONE) learns
exactly what training on the raw input does."""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hashrec.config import load_pipeline_config
from hashrec.features import build_feature_set
from hashrec.tools.gen_taobao_data import generate
from tests.test_train_eval import CONFIG, EDITS, eval_results, run

pytestmark = pytest.mark.slow

SMALL = {**EDITS, "train_config.num_epochs": 1, "train_config.incremental_dump_steps": 0}


def _encode(src: str, dst: str, feature_set) -> None:
    """Each parquet file of ``src`` as a feature generation writes it: a list<int64> column
    of ids per feature, named after the feature, and the labels."""
    os.makedirs(dst)
    for path in sorted(glob.glob(os.path.join(src, "*.parquet"))):
        table = pq.read_table(path)
        batch = feature_set.parse(table)
        columns = {}
        for name in batch.sparse.keys():
            jt = batch.sparse[name]
            offsets = np.concatenate([[0], np.cumsum(jt.lengths.numpy())]).astype(np.int32)
            columns[name] = pa.ListArray.from_arrays(pa.array(offsets),
                                                     pa.array(jt.values.numpy()))
        for label in feature_set.label_fields:
            columns[label] = table[label]
        pq.write_table(pa.table(columns), os.path.join(dst, os.path.basename(path)))


def test_encoded_input_trains_the_same_model(tmp_path):
    data = tmp_path / "raw"
    generate(str(data), 6000, seed=5, scale=0.001, eval_rows=2000, quiet=True)
    feature_set = build_feature_set(load_pipeline_config(CONFIG))
    for split in ("train", "eval"):
        _encode(str(data / split), str(tmp_path / "encoded" / split), feature_set)
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

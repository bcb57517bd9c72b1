"""Integration: training on the raw input encoded by ``encode_input`` (fg_mode FG_NONE)
learns exactly what training on the raw input does, from parquet or CSV raw input."""

from __future__ import annotations

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.tools.encode_input import encode
from hashrec.tools.gen_taobao_data import generate
from tests.test_train_eval import CONFIG, EDITS, eval_results, run

pytestmark = pytest.mark.slow

SMALL = {**EDITS, "train_config.num_epochs": 1, "train_config.incremental_dump_steps": 0}
CSV = {"data_config.dataset_type": "CsvDataset", "data_config.with_header": True}


@pytest.mark.parametrize("raw_format", ["parquet", "csv"])
def test_encoded_input_trains_the_same_model(tmp_path, raw_format):
    data = tmp_path / "raw"
    generate(str(data), 6000, seed=5, scale=0.001, eval_rows=2000, quiet=True)
    raw_edits = SMALL
    if raw_format == "csv":  # a CSV file's labels are text: encoded, they are numbers
        for split in ("train", "eval"):
            for part in (data / split).glob("*.parquet"):
                pacsv.write_csv(pq.read_table(part), part.with_suffix(".csv"))
                part.unlink()
        raw_edits = {**SMALL, **CSV}
    config = apply_edit_config_json(load_pipeline_config(CONFIG), {
        k: v for k, v in raw_edits.items() if k.startswith("data_config.")})
    for split in ("train", "eval"):
        encode(config, str(data / split), str(tmp_path / "encoded" / split), quiet=True)
    aucs = {}
    for kind, edits in (("raw", raw_edits), ("encoded", {**SMALL,
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

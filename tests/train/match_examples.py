"""TorchEasyRec's match-model examples (tests/config/testdata) on local files: generated
Taobao-like parquet and a local item table in place of their ODPS inputs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hashrec.config import apply_edit_config_json, load_pipeline_config

TESTDATA = Path(__file__).parent.parent / "config" / "testdata"


def local_match_example(tmp_path, name: str, edits: dict | None = None):
    """The example ``torcheasyrec_<name>.config`` reading 128 generated training and 64
    evaluation rows, one epoch of batches of 64, 32 sampled negatives from an item table
    of the training rows' items."""
    from hashrec.tools.gen_taobao_data import generate

    generate(str(tmp_path / "data"), 128, seed=1, scale=0.01, eval_rows=64, quiet=True)
    train = pq.read_table(tmp_path / "data" / "train").to_pydict()
    fields = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand", "price")
    attrs = {row[0]: "\x02".join(map(str, row)) for row in zip(*(train[f] for f in fields))}
    pq.write_table(pa.table({"id": list(attrs), "weight": [1.0] * len(attrs),
                             "attrs": list(attrs.values())}), tmp_path / "items.parquet")
    return apply_edit_config_json(load_pipeline_config(TESTDATA / f"torcheasyrec_{name}.config"), {
        "data_config.dataset_type": "ParquetDataset", "data_config.batch_size": 64,
        "data_config.num_workers": 0, "data_config.negative_sampler.num_sample": 32,
        "data_config.negative_sampler.input_path": str(tmp_path / "items.parquet"),
        "train_config.num_epochs": 1, "model_dir": str(tmp_path / "m"),
        "train_input_path": str(tmp_path / "data" / "train"),
        "eval_input_path": str(tmp_path / "data" / "eval"), **(edits or {})})

"""TorchEasyRec's match-model examples and test configs (tests/config/testdata) on local
files: generated Taobao-like (or, for its DAT test config, mock) parquet and a local item
table in place of their ODPS inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


# TorchEasyRec's DAT test config reads encoded input (fg_mode FG_NONE, TorchEasyRec's
# default): each feature its own column; ids within each feature's num_buckets, a raw value
# with boundaries its bucket (5 of them), one without its value, a value_dim 4 feature a
# list of 4 floats. An item's columns are fixed.
MOCK_USER_IDS = {"user_id": 1000000, "user_id_1": 10000, "user_id_2": 1000,
                 "user_id_3": 100, "user_id_4": 100}
MOCK_ITEM_IDS = {"item_id_1": 10000, "item_id_2": 1000}
MOCK_ITEM_COLUMNS = ("item_id", "item_id_1", "item_id_2", "item_raw_1", "item_raw_2",
                     "item_raw_3")


def _mock_raws(rng, prefix: str, count: int) -> dict:
    return {f"{prefix}_raw_1": rng.integers(0, 5, count),
            f"{prefix}_raw_2": rng.normal(size=count),
            f"{prefix}_raw_3": pa.array(list(rng.uniform(0, 1, (count, 4))),
                                        pa.list_(pa.float64()))}


def mock_items(count: int = 40) -> pa.Table:
    """``count`` items of the DAT test config's item columns (ids 3, 10, 17, ...)."""
    rng = np.random.default_rng(7)
    ids = {name: rng.integers(0, size, count) for name, size in MOCK_ITEM_IDS.items()}
    return pa.table({"item_id": np.arange(count) * 7 + 3, **ids,
                     **_mock_raws(rng, "item", count)})


def _mock_rows(items: pa.Table, count: int, seed: int) -> pa.Table:
    """``count`` clicks of random users on random ``items``."""
    rng = np.random.default_rng(seed)
    users = {name: rng.integers(0, size, count) for name, size in MOCK_USER_IDS.items()}
    users.update(_mock_raws(rng, "user", count))
    clicked = items.take(rng.integers(0, items.num_rows, count))
    return pa.table({**users, **{c: clicked[c] for c in clicked.column_names},
                     "clk": np.ones(count)})


def local_dat_mock(tmp_path, edits: dict | None = None):
    """TorchEasyRec's ``torcheasyrec_dat_mock.config`` reading 128 generated training and
    64 evaluation rows of its columns, one epoch of batches of 64, 32 sampled negatives
    from an item table (``mock_items``, TorchEasyRec's schema: attrs joined by ``\\x02``,
    a list's values by ``\\x1d``). The config sets no ``fg_mode``, which TorchEasyRec
    reads as FG_NONE and HashRec as raw input: ``fg_mode: FG_NONE`` is set."""
    items = mock_items()
    pq.write_table(_mock_rows(items, 128, 0), tmp_path / "train.parquet")
    pq.write_table(_mock_rows(items, 64, 1), tmp_path / "eval.parquet")
    texts = [[str(v) if not isinstance(v, list) else "\x1d".join(map(str, v))
              for v in items[c].to_pylist()] for c in MOCK_ITEM_COLUMNS]
    pq.write_table(pa.table({"id": items["item_id"], "weight": [1.0] * items.num_rows,
                             "attrs": ["\x02".join(row) for row in zip(*texts)]}),
                   tmp_path / "items.parquet")
    config = load_pipeline_config(TESTDATA / "torcheasyrec_dat_mock.config")
    return apply_edit_config_json(config, {
        "data_config.fg_mode": "FG_NONE", "data_config.batch_size": 64,
        "data_config.num_workers": 0,
        "data_config.negative_sampler.num_sample": 32,
        "data_config.negative_sampler.input_path": str(tmp_path / "items.parquet"),
        "train_config.num_epochs": 1, "model_dir": str(tmp_path / "m"),
        "train_input_path": str(tmp_path / "train.parquet"),
        "eval_input_path": str(tmp_path / "eval.parquet"), **(edits or {})})

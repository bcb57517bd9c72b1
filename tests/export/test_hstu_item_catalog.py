"""HSTU match's item tower export reads an item catalog as TorchEasyRec's does: one row per
item, the candidate sequence's sub-features under their bare names (``video_id``,
``video_cat``, ``video_len`` for ``cand_seq__video_id`` ...), and embeds each item as the
whole model embeds it as a candidate; the catalog columns win over candidate columns held
beside them, and a catalog without one of its columns is an error naming it."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import parse_pipeline_config
from hashrec.data import DataError
from hashrec.export.exporter import export_model
from hashrec.export.item_catalog import catalog_columns
from hashrec.export.towers import tower_feature_set
from hashrec.predict import predict
from hashrec.train import train_and_evaluate
from hashrec.train.session import build_session

ITEMS, HISTORY, POSITIVES = 40, 6, 3
CATALOG = ["video_id", "video_cat", "video_len"]
CANDIDATE = [f"cand_seq__{name}" for name in CATALOG]


def _cat(item: int) -> int:
    return item % 7


def _len(item: int) -> float:
    return round(0.25 * (item % 11), 2)


def _rows(count: int, seed: int) -> pa.Table:
    """Histories of 1 to HISTORY random items; 1 to POSITIVES candidates, each with its
    item's category and length (``_cat``, ``_len``)."""
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {"uih_seq__video_id": [], **{c: [] for c in CANDIDATE}}
    for _ in range(count):
        history = rng.integers(0, ITEMS, rng.integers(1, HISTORY + 1))
        items = rng.integers(0, ITEMS, rng.integers(1, POSITIVES + 1))
        columns["uih_seq__video_id"].append("|".join(map(str, history)))
        for column, of in zip(CANDIDATE, (int, _cat, _len)):
            columns[column].append("|".join(str(of(int(i))) for i in items))
    return pa.table(columns)


def _config(tmp_path, fg_mode: str = "FG_DAG") -> str:
    item = ('id_feature { feature_name: "video_id" expression: "item:video_id" '
            f'embedding_name: "video_id_emb" embedding_dim: 8 num_buckets: {ITEMS} }}')
    side = ('features { id_feature { feature_name: "cat" expression: "item:video_cat" '
            'embedding_dim: 4 num_buckets: 7 } } features { raw_feature { feature_name: '
            '"video_len" expression: "item:video_len" } }')
    return f"""
train_input_path: "{tmp_path}/train.parquet"
eval_input_path: "{tmp_path}/train.parquet"
model_dir: "{tmp_path}/model"
train_config {{
  sparse_optimizer {{ adagrad_optimizer {{ lr: 0.1 }} constant_learning_rate {{}} }}
  dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} constant_learning_rate {{}} }}
  num_steps: 4
}}
data_config {{
  batch_size: 16 dataset_type: ParquetDataset fg_mode: {fg_mode} num_workers: 0
  force_base_data_group: true
  negative_sampler {{ input_path: "{tmp_path}/items.parquet" num_sample: 5
    attr_fields: ["video_id", "video_cat", "video_len"] item_id_field: "cand_seq__video_id"
    attr_delimiter: "\\t" }}
}}
feature_configs {{ sequence_feature {{ sequence_name: "uih_seq" sequence_length: {HISTORY}
  sequence_delim: "|" features {{ {item} }} }} }}
feature_configs {{ sequence_feature {{ sequence_name: "cand_seq" sequence_length: {POSITIVES}
  sequence_delim: "|" features {{ {item} }} {side} }} }}
model_config {{
  feature_groups {{ group_name: "uih" feature_names: "uih_seq__video_id"
    group_type: JAGGED_SEQUENCE }}
  feature_groups {{ group_name: "candidate" feature_names: ["cand_seq__video_id",
    "cand_seq__cat", "cand_seq__video_len"] group_type: JAGGED_SEQUENCE }}
  hstu_match {{
    user_tower {{ input: "uih" max_seq_len: {HISTORY}
      hstu {{ stu {{ embedding_dim: 8 num_heads: 2 hidden_dim: 4 attention_dim: 4
                   output_dropout_ratio: 0 }}
             input_dropout_ratio: 0 attn_num_layers: 1
             positional_encoder {{ num_position_buckets: 8 }}
             input_preprocessor {{ uih_preprocessor {{}} }}
             output_postprocessor {{ l2norm_postprocessor {{}} }} }} }}
    item_tower {{ input: "candidate" mlp {{ hidden_units: 8 activation: "" }} }}
    similarity: COSINE temperature: 0.05
  }}
  metrics {{ recall_at_k {{ top_k: 1 }} }}
  losses {{ softmax_cross_entropy {{}} }}
}}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(tmp dir, config, export dir, {item: its embedding as the whole model's candidate})
    of a model trained 4 steps and exported."""
    tmp_path = tmp_path_factory.mktemp("hstu_catalog")
    pq.write_table(_rows(200, 1), tmp_path / "train.parquet")
    ids = np.arange(ITEMS)
    pq.write_table(pa.table({"id": ids, "weight": np.ones(ITEMS),
                             "attrs": [f"{i}\t{_cat(i)}\t{_len(i)}" for i in ids]}),
                   tmp_path / "items.parquet")
    config = parse_pipeline_config(_config(tmp_path))
    train_and_evaluate(config)
    checkpoint = latest_checkpoint(str(tmp_path / "model"))
    export_model(config, str(tmp_path / "export"), checkpoint)
    return tmp_path, config, tmp_path / "export", _candidates(config, checkpoint,
                                                               str(tmp_path / "train.parquet"))


def _candidates(config, checkpoint: str, path: str) -> dict[int, torch.Tensor]:
    """Every candidate item of ``path``'s rows -> the restored whole model's item tower
    embedding of it at a candidate position (eagerly)."""
    session = build_session(config, device=torch.device("cpu"))
    model = session.model
    restore_checkpoint(checkpoint, model, None, model.embedding.dynamic_tables(),
                       restore_optimizer=False)
    model.eval()
    out: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for batch in session.loader(path, "predict"):
            inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
            items = model.item_tower(inputs[6])  # (B, K, D), every candidate position
            ids = batch.sparse["cand_seq__video_id"]
            offsets = torch.cumsum(ids.lengths, 0) - ids.lengths
            for row, (start, count) in enumerate(zip(offsets.tolist(), ids.lengths.tolist())):
                for k in range(min(count, POSITIVES)):
                    out.setdefault(int(ids.values[start + k]), items[row, k])
    return out


def _catalog(items) -> pa.Table:
    return pa.table({"video_id": list(items), "video_cat": [_cat(i) for i in items],
                     "video_len": [_len(i) for i in items]})


def _embedded(export, tmp_path, table: pa.Table, name: str) -> torch.Tensor:
    pq.write_table(table, tmp_path / f"{name}.parquet")
    predict(str(export / "item"), str(tmp_path / f"{name}.parquet"),
            str(tmp_path / f"{name}_out.parquet"))
    out = pq.read_table(tmp_path / f"{name}_out.parquet")
    return torch.tensor(out["item_tower_emb"].to_pylist())


def test_the_item_export_embeds_a_catalog_as_the_whole_model_its_candidates(exported):
    tmp_path, _, export, candidates = exported
    items = sorted(candidates)
    assert len(items) > ITEMS // 2  # most items were a candidate somewhere
    meta = json.loads((export / "item" / "tower.json").read_text())
    assert meta["input_columns"] == CATALOG and meta["candidate_columns"] == CANDIDATE
    got = _embedded(export, tmp_path, _catalog(items), "catalog")
    torch.testing.assert_close(got, torch.stack([candidates[i] for i in items]),
                               rtol=1e-5, atol=1e-5)
    # text cells read alike, and so does a CSV catalog (its header names the columns)
    text = pa.table({c: _catalog(items)[c].cast(pa.string()) for c in CATALOG})
    torch.testing.assert_close(_embedded(export, tmp_path, text, "text"), got,
                               rtol=0, atol=0)
    lines = [",".join(reversed(CATALOG))] + [f"{_len(i)},{_cat(i)},{i}" for i in items]
    (tmp_path / "catalog.csv").write_text("\n".join(lines) + "\n")
    predict(str(export / "item"), str(tmp_path / "catalog.csv"),
            str(tmp_path / "csv_out.parquet"), reserved_columns=("video_id",))
    out = pq.read_table(tmp_path / "csv_out.parquet")
    assert out["video_id"].to_pylist() == [str(i) for i in items]
    torch.testing.assert_close(torch.tensor(out["item_tower_emb"].to_pylist()), got,
                               rtol=0, atol=0)


def test_catalog_columns_win_over_candidate_columns_beside_them(exported, caplog):
    tmp_path, _, export, candidates = exported
    items = sorted(candidates)[:6]
    both = _catalog(items)
    others = list(reversed(items))  # the candidate columns name other items
    for column, of in zip(CANDIDATE, (int, _cat, _len)):
        both = both.append_column(column, pa.array([str(of(i)) for i in others]))
    with caplog.at_level(logging.WARNING, logger="hashrec.predict"):
        got = _embedded(export, tmp_path, both, "both")
    torch.testing.assert_close(got, torch.stack([candidates[i] for i in items]),
                               rtol=1e-5, atol=1e-5)
    assert "the candidate columns are not" in caplog.text
    # candidate columns alone: each row's first candidate, as before
    alone = _embedded(export, tmp_path, both.select(CANDIDATE), "candidates")
    torch.testing.assert_close(alone, torch.stack([candidates[i] for i in others]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("missing", ["video_cat", "video_len"])
def test_a_catalog_without_a_column_is_an_error_naming_it(exported, missing):
    tmp_path, _, export, candidates = exported
    table = _catalog(sorted(candidates)[:3])
    table = table.drop_columns([missing])
    with pytest.raises(DataError, match=rf"column '{missing}' is missing.*item catalog"):
        _embedded(export, tmp_path, table, f"without_{missing}")


@pytest.mark.parametrize("fg_mode, columns", [
    ("FG_DAG", {"cand_seq__video_id": "video_id", "cand_seq__cat": "video_cat",
                "cand_seq__video_len": "video_len"}),
    # encoded input: a sub-feature reads the column named as itself, a catalog its name
    ("FG_NONE", {"cand_seq__video_id": "video_id", "cand_seq__cat": "cat",
                 "cand_seq__video_len": "video_len"})], ids=["raw", "encoded"])
def test_catalog_columns_are_the_candidate_columns_without_the_sequence(tmp_path, fg_mode,
                                                                        columns):
    config = parse_pipeline_config(_config(tmp_path, fg_mode))
    assert catalog_columns(config, tower_feature_set(config, "item")) == columns

"""DSSM end to end with negative_sampler_v2, hard_negative_sampler and
hard_negative_sampler_v2 on the planted world of test_dssm_learns (users click items of
their own group): each learns it (recall@5 far above chance), reads its tables once, and
its export predicts as without hard negatives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_dssm_learns import GROUPS, _config, _write_data

import hashrec.data.edge_sampler as edge_module
import hashrec.data.sampler as sampler_module
from hashrec.checkpoint import latest_checkpoint
from hashrec.config import parse_pipeline_config, validate_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import train_and_evaluate

USERS, ITEMS = 48, 96


def _tables(tmp_path) -> dict[str, str]:
    """Items 0-95; positive edges: each user to every item of its group; hard edges: to
    every item of the next group (the planted world's items a user never clicks)."""
    items = np.arange(ITEMS)
    pq.write_table(pa.table({"id": items, "weight": np.ones(ITEMS),
                             "attrs": [str(i) for i in items]}), tmp_path / "items.parquet")
    pq.write_table(pa.table({"id": np.arange(USERS), "weight": np.ones(USERS)}),
                   tmp_path / "users.parquet")
    users = np.repeat(np.arange(USERS), ITEMS // GROUPS)
    within = np.tile(np.arange(ITEMS // GROUPS) * GROUPS, USERS)
    for name, shift in (("positive", 0), ("hard", 1)):
        pq.write_table(pa.table({"src_id": users, "dst_id": within + (users + shift) % GROUPS,
                                 "weight": np.ones(len(users))}),
                       tmp_path / f"{name}.parquet")
    return {"user_input_path": tmp_path / "users.parquet",
            "item_input_path": tmp_path / "items.parquet",
            "pos_edge_input_path": tmp_path / "positive.parquet",
            "hard_neg_edge_input_path": tmp_path / "hard.parquet"}


# The tables each sampler reads.
TABLES = {"negative_sampler_v2": ("user", "item", "pos_edge"),
          "hard_negative_sampler": ("user", "item", "hard_neg_edge"),
          "hard_negative_sampler_v2": ("user", "item", "pos_edge", "hard_neg_edge")}


def _sampler(name: str, paths: dict) -> str:
    fields = TABLES[name]
    text = " ".join(f'{f}_input_path: "{paths[f + "_input_path"]}"' for f in fields)
    hard = " num_hard_sample: 4" if "hard" in name else ""
    return (f'{name} {{ {text} num_sample: 16{hard} attr_fields: "adgroup_id" '
            f'item_id_field: "adgroup_id" user_id_field: "user_id" }}')


@pytest.mark.parametrize("name", ["negative_sampler_v2", "hard_negative_sampler",
                                  "hard_negative_sampler_v2"])
def test_dssm_learns_the_planted_affinity_with_each_sampler(tmp_path, monkeypatch, name):
    _write_data(tmp_path)
    paths = _tables(tmp_path)
    reads = []
    for module in (sampler_module, edge_module):
        read_table = module.read_table
        monkeypatch.setattr(module, "read_table",
                            lambda file, *rest, read=read_table: reads.append(file) or
                            read(file, *rest))
    config = parse_pipeline_config(_config(tmp_path, "", 4, _sampler(name, paths)))
    config.train_config.save_checkpoints_steps = 96  # two evaluations
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    assert result["step"] == 192
    # 1 + 16 (+ up to 4 hard) candidates a row: chance puts the positive in the top 5 for
    # at most 5/17 (0.29) of the rows
    assert result["recall@5"] > 0.6, result
    # user, item and edge tables: each read once in a run of two evaluations
    assert sorted(reads) == sorted(str(paths[f"{t}_input_path"]) for t in TABLES[name])
    if name != "hard_negative_sampler_v2":
        return
    export_model(config, str(tmp_path / "export"), latest_checkpoint(str(tmp_path / "model")))
    predict(str(tmp_path / "export"), str(tmp_path / "eval.parquet"),
            str(tmp_path / "pred.parquet"))
    out = pq.read_table(tmp_path / "pred.parquet")
    assert out.column_names == ["item_tower_emb", "similarity", "user_tower_emb"]
    user = torch.tensor(out["user_tower_emb"].to_pylist())
    item = torch.tensor(out["item_tower_emb"].to_pylist())
    torch.testing.assert_close(torch.tensor(out["similarity"].to_pylist()),
                               (user * item).sum(dim=1) / 0.1, rtol=1e-5, atol=1e-5)

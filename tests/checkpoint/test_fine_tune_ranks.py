"""Fine-tune starts across world sizes (gloo, CPU): a checkpoint of one process restores
on 2 ranks, each keeping the rows it owns, and one saved by 2 ranks restores in one
process; renamed and reordered fused tables included, one summary on rank 0."""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch
from fine_tune_helpers import DIM, session_of, table_entries, trained_model, write_config

from hashrec.checkpoint import save_checkpoint
from hashrec.checkpoint.param_map import read_param_map
from hashrec.table.hashing import owner_of
from hashrec.train.checkpoints import restore_for_training

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "distributed"))
from dist_workers import run_world  # noqa: E402

WORLD = 2
LOGGER = "hashrec.checkpoint.fine_tune"
# The DEEP group renamed, user_id renamed and moved after item_id (their tags swap).
VARIANT = {"features": ("item_id", "user_id", "cate", "shop"), "group": "main",
           "renamed": {"user_id": "uid"}}
MAP = "towers.main towers.deep\nuid user_id\n"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _fine_tune(root: str, checkpoint: str, name: str, ctx=None) -> dict:
    """The variant restored from ``checkpoint``: its state, tables and summary lines."""
    session = session_of(os.path.join(root, "variant.config"), ctx)
    records = _Records()
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    try:
        restore_for_training(os.path.join(root, name), session.model, session.dense, False,
                             checkpoint, param_map=read_param_map(os.path.join(root, "map.txt")))
    finally:
        logger.removeHandler(records)
    return {"state": session.model.state_dict(), "logged": records.messages,
            "tables": {t: table_entries(session.model, t) for t in ("uid", "item_id")}}


def _save(root: str, ctx) -> dict:
    """The base model trained on this rank, saved by both ranks together."""
    model = trained_model(os.path.join(root, "base.config"), ctx)
    save_checkpoint(os.path.join(root, "saved-2"), 3, model, None,
                    model.embedding.dynamic_tables())
    return {"state": model.state_dict(),
            "tables": {t: table_entries(model, t) for t in ("user_id", "item_id")}}


def _check_state(state: dict, old_state: dict) -> None:
    """A variant restored from the base: its tower (renamed), head and dense rows."""
    for key, value in state.items():
        source = key.replace("towers.main.", "towers.deep.")
        if key.endswith(".rows"):
            assert torch.equal(value[:, :DIM], old_state[source][:, :DIM]), key
        else:
            assert torch.equal(value, old_state[source]), key


def _check_tables(tables: dict, old_tables: dict) -> None:
    """The variant's tables hold the base's rows, user_id's as uid."""
    for new, old in (("uid", "user_id"), ("item_id", "item_id")):
        got, want = tables[new], old_tables[old]
        assert len(want) == 20 and got.keys() == want.keys(), new
        assert all(torch.equal(got[k][:DIM], want[k][:DIM]) for k in got), new


def _merged(results: list[dict], names) -> dict:
    return {name: {k: v for r in results for k, v in r["tables"][name].items()}
            for name in names}


def test_fine_tune_start_reshards_both_ways(tmp_path):
    root = str(tmp_path)
    write_config(tmp_path / "base.config")
    write_config(tmp_path / "variant.config", **VARIANT)
    (tmp_path / "map.txt").write_text(MAP, encoding="utf-8")
    old = trained_model(os.path.join(root, "base.config"))
    saved_1 = save_checkpoint(os.path.join(root, "saved-1"), 5, old, None,
                              old.embedding.dynamic_tables())

    results = run_world({"fine_tune": functools.partial(_fine_tune, root, saved_1, "new"),
                         "save": functools.partial(_save, root)}, WORLD, root)
    for result in results["fine_tune"] + results["save"]:
        assert not isinstance(result, Exception), result
    ranks = results["fine_tune"]
    for rank, result in enumerate(ranks):
        for entries in result["tables"].values():
            keys = torch.tensor(sorted(entries), dtype=torch.int64)
            assert bool((owner_of(keys, WORLD) == rank).all())
        _check_state(result["state"], old.state_dict())
    _check_tables(_merged(ranks, ("uid", "item_id")),
                  {t: table_entries(old, t) for t in ("user_id", "item_id")})
    assert len(ranks[0]["logged"]) == 1 and ranks[1]["logged"] == []
    assert ranks[0]["logged"][0].endswith(
        "restored final, output, towers.main (from towers.deep), tables cate, item_id, "
        "shop, uid (from user_id)")

    alone = _fine_tune(root, os.path.join(root, "saved-2", "model.ckpt-3"), "alone")
    _check_state(alone["state"], results["save"][0]["state"])
    _check_tables(alone["tables"], _merged(results["save"], ("user_id", "item_id")))

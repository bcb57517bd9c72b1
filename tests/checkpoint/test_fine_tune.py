"""Fine-tune starts: what of a checkpoint fits a changed model is restored bit for bit,
the rest starts as a fresh model of the new config would; one summary says which."""

from __future__ import annotations

import logging

import pytest
import torch
from fine_tune_helpers import (
    DIM,
    DYNAMIC,
    session_of,
    table_entries,
    trained_model,
    write_config,
    write_data,
)

from hashrec.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint
from hashrec.checkpoint.param_map import read_param_map
from hashrec.train.checkpoints import restore_for_training

LOGGER = "hashrec.checkpoint.fine_tune"
# Added: brand (dynamic, fused first into the DEEP storage: the old tables' tags move)
# and age (num_buckets); the DEEP tower reads 6 features and gains a layer.
GROWN = {"features": ("brand", "user_id", "item_id", "cate", "shop", "age"),
         "hidden_units": (8, 8)}
RENAMED = {"group": "main", "renamed": {"user_id": "uid"}}
# What the base and the grown models share, by the same names.
SAME = {p: p for p in ("final", "output", "embedding.dense_tables.cate",
                       "embedding.dense_tables.shop", "embedding.zch_remappers.shop")}
MAP = "# this model   the checkpoint\ntowers.main    towers.deep   # the DEEP tower\nuid user_id\n"


@pytest.fixture
def saved(tmp_path):
    """(the trained base model, its checkpoint)."""
    model = trained_model(write_config(tmp_path / "base.config"))
    path = save_checkpoint(str(tmp_path / "old"), 5, model, None,
                           model.embedding.dynamic_tables())
    return model, path


def _fine_tuned(tmp_path, path, caplog, param_map=None, **variant):
    """(the model of ``variant`` restored from ``path``, a fresh one of the same config,
    (level, message) of the one summary logged)."""
    config = write_config(tmp_path / "new.config", **variant)
    session = session_of(config)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        restore_for_training(str(tmp_path / "new"), session.model, session.dense, False,
                             path, param_map=param_map)
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    return session.model, session_of(config).model, (record.levelno, record.getMessage())


def _assert_parts(new, old, fresh, restored: dict[str, str]) -> None:
    """Keys under a prefix of ``restored`` ({new prefix: old prefix}) hold the old values
    (dense rows: their embedding columns; optimizer columns as fresh), others the fresh."""
    new_state, old_state, fresh_state = new.state_dict(), old.state_dict(), fresh.state_dict()
    for key, value in new_state.items():
        prefix = next((p for p in restored if key.startswith(p + ".")), None)
        if prefix is None:
            assert torch.equal(value, fresh_state[key]), key
            continue
        source = old_state[restored[prefix] + key[len(prefix):]]
        if key.endswith(".rows"):
            assert torch.equal(value[:, :DIM], source[:, :DIM]), key
            assert torch.equal(value[:, DIM:], fresh_state[key][:, DIM:]), key
            assert not torch.equal(value, source), key  # the saved optimizer columns: 0.7
        else:
            assert torch.equal(value, source), key


def _assert_rows(new, new_name: str, old, old_name: str) -> None:
    want, got = table_entries(old, old_name), table_entries(new, new_name)
    assert len(want) == 20 and got.keys() == want.keys(), new_name
    for key, row in got.items():
        assert torch.equal(row[:DIM], want[key][:DIM]), (new_name, key)
        assert torch.equal(row[DIM:], torch.zeros(DIM)), (new_name, key)  # Adagrad's start


def test_added_features_and_changed_tower_restore_the_common_parts(tmp_path, saved, caplog):
    old, path = saved
    new, fresh, logged = _fine_tuned(tmp_path, path, caplog, **GROWN)
    locations = new.embedding.table_locations()
    assert locations["user_id"] != old.embedding.table_locations()["user_id"]  # tags moved
    _assert_parts(new, old, fresh, SAME)
    assert not torch.equal(fresh.state_dict()["final.layers.0.layers.0.weight"],
                           old.state_dict()["final.layers.0.layers.0.weight"])
    for name in ("user_id", "item_id"):
        _assert_rows(new, name, old, name)
    assert table_entries(new, "brand") == {}
    assert logged == (logging.WARNING, (
        f"fine-tune start from {path}: restored final, output, tables cate, item_id, shop, "
        f"user_id; start fresh, not in the checkpoint: towers.deep.layers.1, tables age, "
        f"brand; start fresh, shape or kind differs: towers.deep.layers.0.layers.0 (weight "
        f"(8, 24) here, (8, 16) in the checkpoint)"))


def test_an_unchanged_model_restores_as_a_strict_fine_tune_does(tmp_path, saved, caplog):
    old, path = saved
    new, _, logged = _fine_tuned(tmp_path, path, caplog)
    strict = session_of(write_config(tmp_path / "strict.config")).model
    restore_checkpoint(path, strict, None, strict.embedding.dynamic_tables(),
                       restore_optimizer=False)
    state = strict.state_dict()
    assert all(torch.equal(value, state[key]) for key, value in new.state_dict().items())
    for name in ("user_id", "item_id"):
        want = table_entries(strict, name)
        assert {k: r.tolist() for k, r in table_entries(new, name).items()} == \
            {k: r.tolist() for k, r in want.items()}
    assert logged == (logging.INFO, (
        f"fine-tune start from {path}: restored final, output, towers, tables cate, item_id, "
        f"shop, user_id"))


def test_changed_shapes_and_kinds_start_fresh_and_are_named(tmp_path, saved, caplog):
    old, path = saved
    new, fresh, logged = _fine_tuned(tmp_path, path, caplog, dims={"item_id": 8}, changed={
        "cate": "num_buckets: 6", "shop": "num_buckets: 16"})
    _assert_parts(new, old, fresh, {"final": "final", "output": "output"})
    assert table_entries(new, "item_id") == {}
    _assert_rows(new, "user_id", old, "user_id")
    assert ("table cate (5 rows in the checkpoint, 6 (num_buckets) in the config), table "
            "item_id (embedding_dim 8 here, 4 in the checkpoint), table shop (a num_buckets "
            "table here, ZCH in the checkpoint)") in logged[1]


def test_param_map_renames_a_deep_tower_and_a_dynamic_table(tmp_path, saved, caplog):
    old, path = saved
    map_file = tmp_path / "map.txt"
    map_file.write_text(MAP, encoding="utf-8")
    new, fresh, logged = _fine_tuned(tmp_path, path, caplog, read_param_map(str(map_file)),
                                     **RENAMED)
    assert list(new.embedding.dynamic_tables()) == ["main"]
    _assert_parts(new, old, fresh, {"towers.main": "towers.deep", **SAME})
    _assert_rows(new, "uid", old, "user_id")
    _assert_rows(new, "item_id", old, "item_id")
    assert logged == (logging.INFO, (
        f"fine-tune start from {path}: restored final, output, towers.main (from "
        f"towers.deep), tables cate, item_id, shop, uid (from user_id)"))


def test_without_the_map_renamed_parts_start_fresh(tmp_path, saved, caplog):
    old, path = saved
    new, fresh, logged = _fine_tuned(tmp_path, path, caplog, **RENAMED)
    _assert_parts(new, old, fresh, SAME)
    assert table_entries(new, "uid") == {}
    assert logged[1].endswith(
        "start fresh, not in the checkpoint: towers, table uid; in the checkpoint but "
        "read by nothing: towers, table user_id")


@pytest.mark.parametrize("line, message", [
    ("towers.nope towers.deep", r"map\.txt:2: 'towers\.nope' is no table of this model and "
                                r"no prefix of its parameter names.*towers\.main"),
    ("towers.main towers.gone", r"map\.txt:2: 'towers\.gone' is no table of the checkpoint"
                                r".*its tables: cate, item_id, shop, user_id"),
    ("uid towers.deep", r"map\.txt:2: 'uid' is a dynamic table of this model but "
                        r"'towers\.deep' is no table of the checkpoint"),
    ("uid cate", r"map\.txt:2: 'uid' is a dynamic table of this model, 'cate' a num_buckets "
                 r"table of the checkpoint"),
    ("towers.main", r"map\.txt:2: expected '<name in this model> <name in the checkpoint>', "
                    r"got 'towers\.main'"),
    ("uid user_id\nuid item_id", r"map\.txt:3: 'uid' is mapped again \(first on line 2\)"),
], ids=["unknown-model-prefix", "unknown-checkpoint-prefix", "table-to-prefix",
        "table-kinds", "one-name", "twice"])
def test_bad_map_lines_are_errors_naming_file_and_line(tmp_path, saved, caplog, line,
                                                       message):
    _, path = saved
    map_file = tmp_path / "map.txt"
    map_file.write_text(f"# header\n{line}\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=message):
        _fine_tuned(tmp_path, path, caplog, read_param_map(str(map_file)), **RENAMED)


def test_map_path_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "map.txt").write_text("\n  # only\n\ta  b  # trailing\n", encoding="utf-8")
    param_map = read_param_map("map.txt")
    assert [(m.model_name, m.checkpoint_name, m.line) for m in param_map.lines] == \
        [("a", "b", 3)]
    with pytest.raises(CheckpointError, match=r"fine_tune_ckpt_param_map missing\.txt \(.*"
                                              r"missing\.txt\): cannot be read \(No such file"):
        read_param_map("missing.txt")


def test_continue_train_stays_strict(tmp_path, saved):
    old, _ = saved
    save_checkpoint(str(tmp_path / "run"), 3, old, None, old.embedding.dynamic_tables())
    session = session_of(write_config(tmp_path / "grown.config", **GROWN))
    with pytest.raises(CheckpointError, match="does not match the model"):
        restore_for_training(str(tmp_path / "run"), session.model, session.dense, True, None)


def test_train_eval_fine_tunes_under_the_config_param_map(tmp_path, monkeypatch, caplog):
    from hashrec.checkpoint import latest_checkpoint
    from hashrec.config import load_pipeline_config
    from hashrec.train import train_and_evaluate

    monkeypatch.chdir(tmp_path)
    data = write_data(tmp_path / "train.parquet")
    base = write_config(tmp_path / "a.config", model_dir=str(tmp_path / "a"), train_path=data)
    train_and_evaluate(load_pipeline_config(base))
    (tmp_path / "map.txt").write_text(MAP, encoding="utf-8")

    def config(map_path: str):
        extra = (f'fine_tune_checkpoint: "{tmp_path / "a"}" '
                 f'fine_tune_ckpt_param_map: "{map_path}"')
        return load_pipeline_config(write_config(
            tmp_path / "b.config", model_dir=str(tmp_path / "b"), train_path=data,
            extra=extra, **RENAMED))

    with pytest.raises(CheckpointError, match=r"missing\.txt .*cannot be read"):
        train_and_evaluate(config("missing.txt"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        train_and_evaluate(config("map.txt"))
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage() == (
        f"fine-tune start from {latest_checkpoint(str(tmp_path / 'a'))}: restored final, "
        f"output, towers.main (from towers.deep), tables cate, item_id, shop, uid (from "
        f"user_id)")
    assert latest_checkpoint(str(tmp_path / "b")).endswith("model.ckpt-2")


def test_a_table_leaving_its_fused_storage_reads_its_rows_there(tmp_path, saved, caplog):
    old, path = saved
    own_init = DYNAMIC.replace("std_dev: 0.05", "std_dev: 0.1")  # no longer fuses
    new, _, logged = _fine_tuned(tmp_path, path, caplog, changed={"item_id": own_init})
    assert sorted(new.embedding.dynamic_tables()) == ["item_id", "user_id"]
    for name in ("user_id", "item_id"):
        _assert_rows(new, name, old, name)
    assert logged[0] == logging.INFO


def test_raw_tables_are_matched_by_storage_name(tmp_path, caplog):
    from checkpoint_helpers import snapshot, table_options, trained_table

    from hashrec.checkpoint import restore_fine_tune
    from hashrec.table import HashTable

    user, fused = trained_table(), trained_table(seed=1, tagged=True)
    path = save_checkpoint(str(tmp_path), 4, None, None, {"user": user, "fused": fused},
                           tag_tables={})
    tables = {"user": HashTable(table_options()), "new": HashTable(table_options())}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        meta = restore_fine_tune(path, None, tables)
    want, got = snapshot(user), snapshot(tables["user"])
    assert torch.equal(got["keys"], want["keys"])
    assert torch.equal(got["rows"][:, :4], want["rows"][:, :4])
    assert torch.equal(got["counts"], want["counts"])  # admission counters come along
    assert int(tables["new"].size()) == 0
    assert meta["loaded"]["user"]["rows"] == len(want["keys"])
    assert caplog.records[-1].getMessage() == (
        f"fine-tune start from {path}: restored table user; start fresh, not in the "
        f"checkpoint: table new; in the checkpoint but read by nothing: table fused")

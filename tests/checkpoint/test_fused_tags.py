"""Fused dynamic tables: tags are restored by table name, whatever the feature order."""

from __future__ import annotations

import json
import os

import pytest
import torch
from checkpoint_helpers import snapshot, table_options, trained_table

from hashrec.checkpoint import restore_checkpoint, save_checkpoint
from hashrec.checkpoint.tags import TAG_TABLES
from hashrec.config import load_pipeline_config
from hashrec.table import HashTable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config")


def _entries(table: HashTable) -> dict[tuple[int, int], torch.Tensor]:
    snap = snapshot(table)
    return {(int(k), int(t)): r for k, t, r in zip(snap["keys"], snap["tags"], snap["rows"])}


def _counters(table: HashTable) -> dict[tuple[int, int], int]:
    snap = snapshot(table)
    return {(int(k), int(t)): int(c) for k, t, c in
            zip(snap["counter_keys"], snap["counter_tags"], snap["counts"])}


def _by_name(entries: dict, names: list[str]) -> dict:
    return {(key, names[tag]): value for (key, tag), value in entries.items()}


def test_reordered_tables_restore_by_name(tmp_path):
    table = trained_table(tagged=True)  # tags 0..2
    saved_names = ["brand", "campaign_id", "customer"]
    path = save_checkpoint(str(tmp_path), 8, None, None, {"deep": table},
                           tag_tables={"deep": saved_names})
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
        assert json.load(f)["tables"]["deep"][TAG_TABLES] == saved_names
    now_names = ["campaign_id", "brand", "customer"]
    restored = HashTable(table_options())
    restore_checkpoint(path, None, None, {"deep": restored}, tag_tables={"deep": now_names})
    want = _by_name(_entries(table), saved_names)
    got = _by_name(_entries(restored), now_names)
    assert want.keys() == got.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert _by_name(_counters(restored), now_names) == _by_name(_counters(table), saved_names)


def test_removed_table_is_skipped_and_added_one_starts_empty(tmp_path):
    table = trained_table(tagged=True)
    saved_names = ["a", "b", "c"]
    path = save_checkpoint(str(tmp_path), 8, None, None, {"deep": table},
                           tag_tables={"deep": saved_names})
    now_names = ["c", "new", "a"]
    restored = HashTable(table_options())
    meta = restore_checkpoint(path, None, None, {"deep": restored},
                              tag_tables={"deep": now_names})
    want = {k: v for k, v in _by_name(_entries(table), saved_names).items() if k[1] != "b"}
    got = _by_name(_entries(restored), now_names)
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert meta["loaded"]["deep"]["rows"] == len(want)


def test_checkpoint_without_the_record_loads_tag_for_tag(tmp_path):
    table = trained_table(tagged=True)
    path = save_checkpoint(str(tmp_path), 8, None, None, {"deep": table}, tag_tables={})
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
        assert TAG_TABLES not in json.load(f)["tables"]["deep"]
    restored = HashTable(table_options())
    restore_checkpoint(path, None, None, {"deep": restored},
                       tag_tables={"deep": ["z", "y", "x"]})
    assert _entries(restored).keys() == _entries(table).keys()


def _config(swap: bool):
    config = load_pipeline_config(CONFIG)
    features = list(config.feature_configs)
    names = [f.id_feature.feature_name for f in features]
    if swap:
        i, j = names.index("brand"), names.index("campaign_id")
        features[i], features[j] = features[j], features[i]
        del config.feature_configs[:]
        config.feature_configs.extend(features)
    return config


def _model(swap: bool):
    from hashrec.train.session import build_session

    torch.manual_seed(0)
    return build_session(_config(swap), device=torch.device("cpu")).model


def test_swapped_feature_configs_read_their_own_rows(tmp_path):
    model = _model(swap=False)
    storage, brand_tag = model.embedding.table_locations()["brand"]
    _, campaign_tag = model.embedding.table_locations()["campaign_id"]
    deep = model.embedding.dynamic_tables()[storage]
    keys = torch.arange(1, 6, dtype=torch.int64)
    for tag, value in ((brand_tag, 1.0), (campaign_tag, 2.0)):
        rows = torch.full((5, deep.row_dim), value)
        deep.load_state(keys, torch.full((5,), tag, dtype=torch.int32), rows,
                        torch.ones(5, dtype=torch.int64))
    path = save_checkpoint(str(tmp_path), 3, model, None, model.embedding.dynamic_tables())

    swapped = _model(swap=True)
    locations = swapped.embedding.table_locations()
    assert locations["brand"][1] == campaign_tag  # the swap moved the tags
    restore_checkpoint(path, swapped, None, swapped.embedding.dynamic_tables(),
                       restore_optimizer=False)
    table = swapped.embedding.dynamic_tables()[storage]
    for name, value in (("brand", 1.0), ("campaign_id", 2.0)):
        tags = torch.full((5,), locations[name][1], dtype=torch.int32)
        values, found = table.find(keys, tags)
        assert bool(found.all()), name
        assert torch.equal(values[:, :table.dim], torch.full((5, table.dim), value)), name


@pytest.mark.parametrize("names", [["a", "a"]], ids=["duplicate"])
def test_damaged_record_is_an_error(tmp_path, names):
    from hashrec.checkpoint import CheckpointError

    table = trained_table(tagged=True)
    path = save_checkpoint(str(tmp_path), 8, None, None, {"deep": table},
                           tag_tables={"deep": names})
    with pytest.raises(CheckpointError, match="names a table twice"):
        restore_checkpoint(path, None, None, {"deep": HashTable(table_options())},
                           tag_tables={"deep": ["b", "a"]})


@pytest.mark.parametrize("direction", ["join", "split"])
def test_a_storage_grouped_otherwise_restores_whole_with_optimizer_state(tmp_path, caplog,
                                                                          direction):
    """Tables saved in storages of their own restore into one fused storage (and back),
    rows, optimizer state, scores and admission counters alike, as a release that fuses
    another group's tables resumes the checkpoints of one that did not."""
    names = ["seq_a", "seq_b"]
    fused = trained_table(tagged=True)  # tags 0..2: two tables and a third, left out
    parts = {name: HashTable(table_options()) for name in names}
    snap = snapshot(fused)
    for tag, name in enumerate(names):
        mine = snap["tags"] == tag
        parts[name].load_state(snap["keys"][mine], None, snap["rows"][mine],
                               snap["scores"][mine])
        counted = snap["counter_tags"] == tag
        parts[name].load_admission_state(snap["counter_keys"][counted], None,
                                         snap["counts"][counted])
    if direction == "join":
        path = save_checkpoint(str(tmp_path), 8, None, None, parts)
        restored = {"seq": HashTable(table_options())}
        tag_tables = {"seq": names}
    else:
        path = save_checkpoint(str(tmp_path), 8, None, None, {"seq": fused},
                               tag_tables={"seq": names + ["gone"]})
        restored = {name: HashTable(table_options()) for name in names}
        tag_tables = {name: [name] for name in names}
    with caplog.at_level("INFO", logger="hashrec.checkpoint.restore"):
        meta = restore_checkpoint(path, None, None, restored, tag_tables=tag_tables)
    assert any("restored table by table" in m for m in caplog.messages)
    # the table the model dropped is named as not restored; the others are not
    unread = [m for m in caplog.messages if "not restored" in m]
    assert len(unread) == (direction == "split")
    assert all("not restored: 'gone' (dynamic)." in m for m in unread)
    for tag, name in enumerate(names):
        if direction == "join":
            got = {key: row for (key, t), row in _entries(restored["seq"]).items() if t == tag}
            counts = {key: c for (key, t), c in _counters(restored["seq"]).items() if t == tag}
        else:
            got = {key: row for (key, _), row in _entries(restored[name]).items()}
            counts = {key: c for (key, _), c in _counters(restored[name]).items()}
        want = {key: row for (key, t), row in _entries(fused).items() if t == tag}
        assert got.keys() == want.keys() and got
        assert all(torch.equal(got[key], want[key]) for key in want)  # optimizer columns too
        assert counts == {key: c for (key, t), c in _counters(fused).items() if t == tag}
    assert sum(n["rows"] for n in meta["loaded"].values()) == sum(
        int((snap["tags"] == tag).sum()) for tag in range(len(names)))


def test_a_table_moving_between_storages_the_checkpoint_holds_by_name(tmp_path, caplog):
    """Saved deep_0 = [a, b], deep_1 = [c]; now deep_0 = [a], deep_1 = [b, c, new]: b's rows
    follow it into deep_1, new starts empty, and nothing is called skipped."""
    src = trained_table(tagged=True)  # tags 0..2: a, b, c
    snap = snapshot(src)
    first, second = HashTable(table_options()), HashTable(table_options())
    ab = snap["tags"] <= 1
    first.load_state(snap["keys"][ab], snap["tags"][ab], snap["rows"][ab], snap["scores"][ab])
    second.load_state(snap["keys"][~ab], torch.zeros_like(snap["tags"][~ab]),
                      snap["rows"][~ab], snap["scores"][~ab])
    path = save_checkpoint(str(tmp_path), 8, None, None, {"deep_0": first, "deep_1": second},
                           tag_tables={"deep_0": ["a", "b"], "deep_1": ["c"]})
    now = {"deep_0": ["a"], "deep_1": ["b", "c", "new"]}
    restored = {name: HashTable(table_options()) for name in now}
    with caplog.at_level("INFO", logger="hashrec.checkpoint"):
        restore_checkpoint(path, None, None, restored, tag_tables=now)
    saved = _by_name(_entries(src), ["a", "b", "c"])
    got = {**_by_name(_entries(restored["deep_0"]), now["deep_0"]),
           **_by_name(_entries(restored["deep_1"]), now["deep_1"])}
    assert got.keys() == saved.keys()
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    text = "\n".join(caplog.messages)
    assert "b (from 'deep_0')" in text and "restored into another storage: ['b']" in text
    assert "start empty: ['new']" in text and "skipped" not in text

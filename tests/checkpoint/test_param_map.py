"""fine_tune_ckpt_param_map: parsing, and names checked against model and checkpoint."""

from __future__ import annotations

import pytest

from hashrec.checkpoint import CheckpointError
from hashrec.checkpoint.param_map import (
    DYNAMIC,
    NUM_BUCKETS,
    Names,
    ParamMap,
    read_param_map,
    resolve_param_map,
)

MODEL = Names({"uid": DYNAMIC, "cate": NUM_BUCKETS},
              frozenset({"towers.deep.layers.0.weight", "towers.deep.layers.1.weight",
                         "towers.deeper.weight", "final.weight"}))
SAVED = Names({"user_id": DYNAMIC, "cate": NUM_BUCKETS},
              frozenset({"towers.user.layers.0.weight", "towers.user.layers.1.weight",
                         "towers.other.weight", "towers.deeper.weight", "final.weight"}))


def _resolved(tmp_path, text: str):
    path = tmp_path / "map.txt"
    path.write_text(text, encoding="utf-8")
    return resolve_param_map(read_param_map(str(path)), MODEL, SAVED)


def test_prefixes_map_at_dot_boundaries_longest_first(tmp_path):
    resolved = _resolved(tmp_path, "towers.deep towers.user\n"
                                   "towers.deep.layers.1 towers.other\nuid user_id\n")
    assert resolved.source_key("towers.deep.layers.0.weight") == "towers.user.layers.0.weight"
    assert resolved.source_key("towers.deep.layers.1.weight") == "towers.other.weight"
    assert resolved.source_key("towers.deeper.weight") == "towers.deeper.weight"
    assert resolved.source_key("final.weight") == "final.weight"
    assert resolved.source_table("uid") == "user_id"
    assert resolved.source_table("cate") == "cate"


def test_no_map_reads_every_name_as_it_is():
    resolved = resolve_param_map(None, MODEL, SAVED)
    assert resolved.source_key("towers.deep.layers.0.weight") == "towers.deep.layers.0.weight"
    assert resolved.source_table("uid") == "uid"


@pytest.mark.parametrize("text, message", [
    ("towers.dee towers.user", r"map\.txt:1: 'towers\.dee' is no table of this model"),
    ("towers.deep towers.use", r"map\.txt:1: 'towers\.use' is no table of the checkpoint"),
    ("cate user_id", r"'cate' is a num_buckets table of this model, 'user_id' a dynamic"),
    ("a b c", r"map\.txt:1: expected '<name in this model> <name in the checkpoint>', "
              r"got 'a b c'"),
], ids=["partial-segment-model", "partial-segment-checkpoint", "kinds", "three-names"])
def test_bad_lines_name_file_and_line(tmp_path, text, message):
    with pytest.raises(CheckpointError, match=message):
        _resolved(tmp_path, text)


def test_unreadable_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"map\.txt .*cannot be read"):
        read_param_map(str(tmp_path / "map.txt"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CheckpointError, match=r"bin\.txt .*cannot be read"):
        read_param_map(str(tmp_path / "bin.txt"))


def test_an_empty_file_maps_nothing(tmp_path):
    (tmp_path / "e.txt").write_text("# nothing yet\n\n", encoding="utf-8")
    assert read_param_map(str(tmp_path / "e.txt")) == ParamMap(str(tmp_path / "e.txt"))

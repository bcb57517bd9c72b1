"""How the input relates to feature generation: fg_mode and the older fg_encoded."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from hashrec.config import data_pb2
from hashrec.config.fg_mode import (
    BUCKETIZE,
    ENCODED,
    RAW,
    fg_input,
    fg_input_setting,
    fg_mode_conflict,
)


def _data(text: str):
    return text_format.Parse(text, data_pb2.DataConfig())


@pytest.mark.parametrize("text, want", [
    ("", RAW),
    ("fg_mode: FG_DAG", RAW),
    ("fg_mode: FG_NORMAL", RAW),
    ("fg_mode: FG_NONE", ENCODED),
    ("fg_mode: FG_BUCKETIZE", BUCKETIZE),
    ("fg_encoded: true", ENCODED),
    ("fg_encoded: false", RAW),
    # fg_encoded decides where set, whatever fg_mode says (TorchEasyRec's
    # _get_compatible_fg_mode)
    ("fg_mode: FG_DAG fg_encoded: true", ENCODED),
    ("fg_mode: FG_NONE fg_encoded: false", RAW),
    ("fg_mode: FG_BUCKETIZE fg_encoded: true", ENCODED),
], ids=["unset", "dag", "normal", "none", "bucketize", "encoded", "not-encoded",
        "dag-encoded", "none-not-encoded", "bucketize-encoded"])
def test_fg_input_follows_fg_encoded_where_set_else_fg_mode(text, want):
    assert fg_input(_data(text)) == want


def test_the_setting_followed_is_named():
    assert fg_input_setting(_data("fg_mode: FG_NONE")) == "data_config.fg_mode is FG_NONE"
    assert fg_input_setting(_data("fg_mode: FG_DAG fg_encoded: true")) == \
        "data_config.fg_encoded is true"
    assert fg_input_setting(None) == "neither data_config.fg_mode nor fg_encoded is set"


@pytest.mark.parametrize("text, read", [
    ("fg_mode: FG_DAG fg_encoded: true", "read as encoded (as FG_NONE)"),
    ("fg_mode: FG_NONE fg_encoded: false", "read as raw (as FG_DAG)"),
    ("fg_mode: FG_BUCKETIZE fg_encoded: true", "read as encoded (as FG_NONE)"),
], ids=["dag-encoded", "none-not-encoded", "bucketize-encoded"])
def test_a_fg_encoded_that_overrides_fg_mode_is_warned(text, read):
    warning = fg_mode_conflict(_data(text))
    assert "fg_encoded decides" in warning and read in warning


@pytest.mark.parametrize("text", ["", "fg_encoded: true", "fg_mode: FG_NONE fg_encoded: true",
                                  "fg_mode: FG_NORMAL fg_encoded: false", "fg_mode: FG_NONE"])
def test_settings_that_agree_give_no_warning(text):
    assert fg_mode_conflict(_data(text)) is None
    assert fg_mode_conflict(None) is None

"""How the input relates to feature generation: ``data_config.fg_mode`` (or the older
``fg_encoded``), as TorchEasyRec reads them.

- ``RAW`` (FG_DAG, FG_NORMAL, or neither field set): raw input; a feature reads the column
  its expression names and hashes, looks up, bucketizes or normalizes it itself.
- ``ENCODED`` (FG_NONE, or ``fg_encoded: true`` without a mode): the input is a feature
  generation's output, bucketized: a feature reads the column named as the feature.
- ``BUCKETIZE`` (FG_BUCKETIZE): the same columns, generated but not bucketized.

HashRec differs from TorchEasyRec in one default only: a config that sets neither field
reads raw input (TorchEasyRec's proto defaults to FG_NONE), which is what a config
without feature generation settings is written for.
"""

from __future__ import annotations

RAW = "raw"
ENCODED = "encoded"
BUCKETIZE = "bucketize"

_OF_MODE = {"FG_DAG": RAW, "FG_NORMAL": RAW, "FG_NONE": ENCODED, "FG_BUCKETIZE": BUCKETIZE}


def fg_mode_name(data_config) -> str | None:
    """The ``fg_mode`` a config sets, by name (``"FG_NONE"``), or None where unset."""
    if not data_config.HasField("fg_mode"):
        return None
    enum = data_config.DESCRIPTOR.fields_by_name["fg_mode"].enum_type
    return enum.values_by_number[data_config.fg_mode].name


def fg_input(data_config) -> str:
    """``RAW``, ``ENCODED`` or ``BUCKETIZE`` for a DataConfig (None: ``RAW``)."""
    if data_config is None:
        return RAW
    name = fg_mode_name(data_config)
    if name is not None:
        return _OF_MODE[name]
    if data_config.HasField("fg_encoded") and data_config.fg_encoded:
        return ENCODED
    return RAW

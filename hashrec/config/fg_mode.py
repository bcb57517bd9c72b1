"""How the input relates to feature generation: ``data_config.fg_mode`` (or the older
``fg_encoded``), as TorchEasyRec reads them.

- ``RAW`` (FG_DAG, FG_NORMAL, or neither field set): raw input; a feature reads the column
  its expression names and hashes, looks up, bucketizes or normalizes it itself.
- ``ENCODED`` (FG_NONE, or ``fg_encoded: true``): the input is a feature generation's
  output, bucketized: a feature reads the column named as the feature.
- ``BUCKETIZE`` (FG_BUCKETIZE): the same columns, generated but not bucketized.

As in TorchEasyRec, ``fg_encoded`` decides where set (true: FG_NONE, false: raw input),
whatever ``fg_mode`` says; ``fg_mode_conflict`` words the warning where the two disagree.
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
    if data_config.HasField("fg_encoded"):  # the older field decides, as in TorchEasyRec
        return ENCODED if data_config.fg_encoded else RAW
    name = fg_mode_name(data_config)
    return RAW if name is None else _OF_MODE[name]


def fg_input_setting(data_config) -> str:
    """The setting ``fg_input`` follows, as logs and errors name it
    (``data_config.fg_mode is FG_NONE``, ``data_config.fg_encoded is true``)."""
    if data_config is not None and data_config.HasField("fg_encoded"):
        return f"data_config.fg_encoded is {str(data_config.fg_encoded).lower()}"
    name = None if data_config is None else fg_mode_name(data_config)
    return f"data_config.fg_mode is {name}" if name else \
        "neither data_config.fg_mode nor fg_encoded is set"


def fg_mode_conflict(data_config) -> str | None:
    """A warning where ``fg_encoded`` and ``fg_mode`` are both set and disagree about the
    input (``fg_encoded`` decides), else None."""
    if data_config is None or not data_config.HasField("fg_encoded"):
        return None
    name = fg_mode_name(data_config)
    if name is None or _OF_MODE[name] == fg_input(data_config):
        return None
    read = "encoded (as FG_NONE)" if data_config.fg_encoded else "raw (as FG_DAG)"
    return (f"data_config.fg_encoded is {str(data_config.fg_encoded).lower()} and fg_mode "
            f"is {name}: fg_encoded decides, as in TorchEasyRec, so the input is read as "
            f"{read}; remove fg_encoded (TorchEasyRec deprecates it) to read it as fg_mode "
            f"says")

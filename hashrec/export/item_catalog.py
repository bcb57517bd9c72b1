"""HSTU match's item tower export over an item catalog, as TorchEasyRec's reads one.

The candidate group of an ``hstu_match`` model is a sequence of a row's positives
(``cand_seq__video_id``). TorchEasyRec exports its item tower over scalar features named as
the bare sub-features: an item catalog, one row per item, its id in column ``video_id`` and
its side information in the other sub-features' bare columns (``video_cat``). ``predict``
on HashRec's ``<export_dir>/item`` reads the same: each sub-feature ``<sequence>__f`` of
the candidate sequence reads its candidate column's name without the ``<sequence>__``
prefix (``video_id`` for ``cand_seq__video_id``; in encoded input, where the sub-feature
reads ``cand_seq__f``, column ``f``), one item a row, parsed as the sub-feature parses a
candidate (an empty cell is its default_value). An item's embedding is then the one the
whole model gives it as a candidate.

Input that holds none of those columns but the candidate columns is read as before: each
row's first candidate is its item (rows of training data). Where the input holds both, the
catalog columns are read, and a warning names the candidate columns left unread. A
catalog without one of its columns is a DataError naming the column.
"""

from __future__ import annotations

import logging

from hashrec.config import model_pb2

logger = logging.getLogger("hashrec.predict")


def catalog_columns(config, feature_set) -> dict[str, str]:
    """Feature name -> its column in an item catalog, for each sub-feature of the candidate
    sequence of ``config``'s hstu_match in ``feature_set`` (its item tower's); empty for
    another model, or a DEEP candidate group (whose rows are a catalog's already)."""
    model_config = config.model_config
    if model_config.WhichOneof("model") != "hstu_match":
        return {}
    name = model_config.hstu_match.item_tower.input
    group = next((g for g in model_config.feature_groups if g.group_name == name), None)
    if group is None or group.group_type == model_pb2.DEEP:
        return {}
    columns = {}
    for feature in feature_set.features.values():
        prefix, column = f"{feature.sequence_name}__", feature.columns[0]
        # a sub-feature of a sequence_feature: a top-level sequence feature has no bare name
        if feature.is_sequence and feature.sequence_name != feature.name \
                and column.startswith(prefix):
            columns[feature.name] = column[len(prefix):]
    return columns


def catalog_input_columns(config, feature_set) -> list[str]:
    """The columns the item tower export of ``config`` (``feature_set`` its item tower's)
    reads from an item catalog: ``feature_set.feature_columns`` where the model has no
    catalog form."""
    return feature_set.reading(catalog_columns(config, feature_set)).feature_columns


def item_tower_input(feature_set, config, data_config, input_path: str):
    """``feature_set``, the item tower export's, as it reads ``input_path`` (its files
    read as ``data_config`` says): reading an item catalog's columns (see the module
    docstring), or the candidate columns where the files hold those and no catalog column;
    ``feature_set`` itself for a model without a catalog form.

    Raises:
        DataError: a file of ``input_path`` is missing or unreadable.
    """
    from hashrec.data.loader import input_column_names

    columns = catalog_columns(config, feature_set)
    if not columns:
        return feature_set
    catalog = feature_set.reading(columns)
    present = set(input_column_names(data_config, input_path))
    candidate = [c for c in feature_set.feature_columns if c not in catalog.feature_columns]
    held = [c for c in catalog.feature_columns if c in present]
    held_candidate = [c for c in candidate if c in present]
    if held_candidate and not held:
        logger.info("%s holds none of the item catalog columns %s but the candidate columns "
                    "%s: each row's first candidate is embedded", input_path,
                    catalog.feature_columns, held_candidate)
        return feature_set
    if held_candidate:
        logger.warning("%s holds the item catalog columns %s and the candidate columns %s: "
                       "the catalog columns are read, one item a row; the candidate columns "
                       "are not", input_path, held, held_candidate)
    sequences = sorted({feature_set.features[name].sequence_name for name in columns})
    note = (f"the item tower of this hstu_match reads an item catalog, one item a row: the "
            f"candidate sequence {', '.join(map(repr, sequences))}'s sub-features under their "
            f"bare names, columns {catalog.feature_columns} (as TorchEasyRec's item export "
            f"reads them); input without any of those columns may hold the candidate "
            f"columns {candidate} instead, each row's first candidate its item")
    catalog.column_notes.update(dict.fromkeys(catalog.feature_columns, note))
    return catalog

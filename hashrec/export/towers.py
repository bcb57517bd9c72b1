"""A match model's towers exported apart: ``<export_dir>/user/`` and ``<export_dir>/item/``.

As TorchEasyRec exports a match model's towers as separate serving models, ``export``
of a DSSM, a DAT, a MIND, a match backbone or an HSTU match writes, beside the whole
model, one directory per tower. Each holds the pipeline config, ``scripted_model.pt`` of
its tower alone (the tables its feature group reads, that group's assembly and the
tower's network (a DAT tower reads its augment group too; a match backbone's tower the
groups its own blocks read; MIND's user tower reads its user group and its behaviour
sequence and gives the user's interests, (B, K, D); HSTU match's user tower its history
and the history's contextual, action and timestamp groups, its item tower the candidate
group); nothing of the other tower, whose id tables may be huge) and ``tower.json``,
which says which tower it is, what it reads and what it gives. HSTU match's item tower
reads an item catalog, one item a row, its candidate sequence's sub-features under their
bare names (``video_id`` for ``cand_seq__video_id``, as TorchEasyRec's item export reads
them; ``hashrec.export.item_catalog``), or the candidate columns (each row's first item):
``tower.json`` lists the catalog's as ``input_columns``, the others as
``candidate_columns``.
``predict`` on such a directory reads the tower's columns only and writes
``<tower>_tower_emb``: users embedded from user features alone, an item index (for ANN
retrieval) from item features alone. The tables' rows stay in the whole model's
safetensors parts (``tower.json`` lists the tower's tables), not written twice."""

from __future__ import annotations

import json
import os

from hashrec.config import save_pipeline_config
from hashrec.config.validate import MATCH_MODELS
from hashrec.export import meta
from hashrec.export.errors import ExportError
from hashrec.export.item_catalog import catalog_input_columns
from hashrec.models.backbone.towers import split_towers

TOWERS = ("user", "item")


def _other(tower: str) -> str:
    return TOWERS[1 - TOWERS.index(tower)]


def tower_group(config, tower: str) -> str:
    """The (first) feature group that ``tower`` ("user" or "item") of ``config``'s match
    model reads."""
    return tower_groups(config, tower)[0]


def tower_groups(config, tower: str) -> list[str]:
    """Every feature group ``tower`` reads: its ``input``, then a DAT tower's
    ``augment_input`` and MIND's user tower's ``history_input`` (the behaviour sequence);
    a match backbone's tower: the groups its blocks read (config order); HSTU match's user
    tower: its ``input`` (the history), then every other group but its item tower's (config
    order)."""
    model_config = config.model_config
    kind = model_config.WhichOneof("model")
    model = getattr(model_config, kind)
    if kind == "match_backbone":
        names = [group.group_name for group in model_config.feature_groups]
        parts = split_towers(model.backbone, names, "model_config.match_backbone.backbone")
        return list(parts[tower].groups)
    if kind == "hstu_match":  # the user tower reads every group but the candidates'
        item, history = model.item_tower.input, model.user_tower.input
        return [item] if tower == "item" else [history] + [
            g.group_name for g in model_config.feature_groups
            if g.group_name not in (item, history)]
    tower_config = getattr(model, f"{tower}_tower")
    more = [getattr(tower_config, field, "") for field in ("augment_input", "history_input")]
    return [tower_config.input] + [group for group in more if group]


def tower_feature_set(config, tower: str):
    """The FeatureSet of ``tower`` alone: the features of its group and their tables
    (``config`` with the other feature groups left out; nothing else changed)."""
    from hashrec.features import build_feature_set

    alone = type(config)()
    alone.CopyFrom(config)
    groups = tower_groups(config, tower)
    kept = [g for g in alone.model_config.feature_groups if g.group_name in groups]
    del alone.model_config.feature_groups[:]
    alone.model_config.feature_groups.extend(kept)
    return build_feature_set(alone, metric_keys=False)


def write_tower_exports(model, config, export_dir: str, hashmaps: dict,
                        missing: dict[str, float]) -> list[str]:
    """Writes ``<export_dir>/<tower>/`` for both towers of the match ``model``; returns the
    files written.

    Args:
        model: the trained match model (DSSM, DAT, MIND, MatchBackbone).
        config: its pipeline config.
        export_dir: the export's (staging) directory.
        hashmaps: hash map table -> (keys sorted, values), every part's (at least the
            towers' tables).
        missing: hash map table -> what an id it does not hold reads as.

    Raises:
        ExportError: a tower does not compile or a file cannot be written.
    """
    from hashrec.export.scripted import build_inference_model, save_scripted

    files = []
    capsule = getattr(model.user_tower, "capsule", None)
    interests = int(capsule.max_k) if capsule is not None else 0
    for tower in TOWERS:
        directory = os.path.join(export_dir, tower)
        feature_set = tower_feature_set(config, tower)
        tables = [spec.name for spec in feature_set.embedding_tables()]
        columns = catalog_input_columns(config, feature_set) if tower == "item" \
            else feature_set.feature_columns
        module = build_inference_model(model, feature_set, hashmaps, missing, tower)
        try:
            os.mkdir(directory)
        except OSError as err:
            raise ExportError(f"cannot create {directory}: {err.strerror}") from None
        config_path = os.path.join(directory, meta.PIPELINE_CONFIG_FILE)
        save_pipeline_config(config, config_path)
        scripted_path = os.path.join(directory, meta.SCRIPTED_MODEL_FILE)
        save_scripted(module, scripted_path)
        entry = {"model": config.model_config.WhichOneof("model"), "tower": tower,
                 "feature_group": tower_group(config, tower),
                 "feature_groups": tower_groups(config, tower),
                 "features": list(feature_set.features),
                 "input_columns": list(columns), "tables": tables,
                 "output": f"{tower}_tower_emb", "dimension": int(model.user_tower.dim),
                 "interests": interests if tower == "user" else 0,
                 "similarity": "COSINE" if model.cosine else "INNER_PRODUCT",
                 "temperature": float(model.temperature),
                 "other_tower": os.path.join("..", _other(tower)), "whole_model": ".."}
        if columns != feature_set.feature_columns:  # the item catalog's, hstu_match's
            entry["candidate_columns"] = list(feature_set.feature_columns)
        meta_path = os.path.join(directory, meta.TOWER_META_FILE)
        try:
            with open(meta_path, "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
        except OSError as err:
            raise ExportError(f"cannot write {meta_path}: {err.strerror}") from None
        files += [config_path, scripted_path, meta_path]
    return files


def read_tower_meta(export_dir: str, model) -> dict | None:
    """``tower.json`` of a tower's export, checked against the scripted ``model`` beside
    it; None for a whole model's export.

    Raises:
        ExportError: the file is unreadable or names no tower, or it and the scripted
            model disagree (files of two exports mixed), or a tower's scripted model has
            no ``tower.json``.
    """
    path = os.path.join(export_dir, meta.TOWER_META_FILE)
    scripted = str(getattr(model, "tower", ""))  # exports before towers have none
    model_path = os.path.join(export_dir, meta.SCRIPTED_MODEL_FILE)
    again = "export the model again with python -m hashrec.export"
    if not os.path.isfile(path):
        if scripted:
            raise ExportError(f"{model_path} is the {scripted} tower of a match model alone, "
                              f"but {meta.TOWER_META_FILE} is missing beside it; {again}")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError) as err:
        raise ExportError(f"{path} cannot be read ({err}); {again}") from None
    tower = entry.get("tower") if isinstance(entry, dict) else None
    if tower not in TOWERS or not isinstance(entry.get("feature_group"), str):
        raise ExportError(f"{path}: 'tower' is {tower!r}, expected one of {list(TOWERS)} "
                          f"with its 'feature_group'; {again}")
    if scripted != tower:
        holds = f"the {scripted} tower" if scripted else "a whole model"
        raise ExportError(f"{path} says this is the {tower} tower's export, but {model_path} "
                          f"is {holds}: the files of two exports are mixed; {again}")
    return entry


def check_tower_outputs(wanted: tuple[str, ...] | None, entry: dict, export_dir: str) -> None:
    """``--output_columns`` of a tower's export: its one embedding column.

    Raises:
        ExportError: a column only the whole model gives (naming where it is).
    """
    others = [c for c in wanted or () if c != entry["output"]]
    if others:
        raise ExportError(
            f"--output_columns {others}: {export_dir} is the {entry['tower']} tower of a "
            f"match model alone ({meta.TOWER_META_FILE}), which gives {entry['output']} only; "
            f"predict with the whole model's export "
            f"{os.path.normpath(os.path.join(export_dir, '..'))} for the other columns")


def note_tower_columns(feature_set, config, export_dir: str, entry: dict | None) -> None:
    """Adds to ``feature_set.column_notes`` why each column is read, for the error of an
    input file without it: a tower's export reads its group's columns; a whole match
    model's reads both towers' (the error names the tower export that reads fewer)."""
    if entry is not None:
        note = (f"{export_dir} embeds the {entry['tower']} tower alone, which reads the "
                f"columns {feature_set.feature_columns} of its feature groups "
                f"{entry.get('feature_groups', [entry['feature_group']])}")
        _add_notes(feature_set, feature_set.feature_columns, note)
        return
    if config.model_config.WhichOneof("model") not in MATCH_MODELS:
        return
    columns = {tower: tower_feature_set(config, tower).feature_columns for tower in TOWERS}
    for tower in TOWERS:
        other = os.path.join(export_dir, _other(tower))
        if not os.path.isfile(os.path.join(other, meta.TOWER_META_FILE)):
            continue  # an export written before the towers were exported apart
        note = (f"the whole match model ({export_dir}) reads both towers' columns, the "
                f"{tower} tower this one; to embed {_other(tower)}s from their own columns "
                f"alone, predict with {other}")
        _add_notes(feature_set, [c for c in columns[tower] if c not in columns[_other(tower)]],
                   note)


def _add_notes(feature_set, columns, note: str) -> None:
    for column in columns:
        earlier = feature_set.column_notes.get(column)
        feature_set.column_notes[column] = f"{earlier}; {note}" if earlier else note

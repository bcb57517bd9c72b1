"""Fine-tune restore of dynamic tables: each logical table reads its rows by name.

A checkpoint records the logical tables of each dynamic storage in tag order
(``hashrec.checkpoint.tags``). A fine-tune start looks every logical table of the
model up there by its name (or the one ``fine_tune_ckpt_param_map`` gives), wherever
it was stored: the same storage, another fused storage, or a storage of its own, so
fusion may change between the runs. The rows of the tables found with the same
embedding_dim are loaded (their optimizer state reset) under this model's tags; a
table not found, or found with another embedding_dim, starts empty.

Storages the checkpoint or the model does not record tags for (checkpoints of raw
tables) are matched as a whole by storage name and loaded tag for tag, as a strict
restore does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hashrec.checkpoint.fine_tune_report import Outcome
from hashrec.checkpoint.param_map import ResolvedMap
from hashrec.checkpoint.shard_file import ShardReader
from hashrec.checkpoint.table_io import (
    check_readers,
    hold_rows,
    load_admission,
    load_rows,
    set_table_step,
)
from hashrec.checkpoint.tags import TAG_TABLES


@dataclass(frozen=True)
class TableSource:
    """Rows of one checkpoint ``storage`` that a model storage loads; ``remap``: saved tag
    -> the model storage's tag (-1: not loaded), None: tag for tag."""

    storage: str
    remap: torch.Tensor | None


def saved_logical_tables(meta_tables: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """{logical table: (checkpoint storage, tag)}; a storage without a record stands for
    one table of its own name at tag 0 (as strict restores assume)."""
    where = {}
    for storage, described in meta_tables.items():
        for tag, name in enumerate(described.get(TAG_TABLES) or [storage]):
            where[name] = (storage, tag)
    return where


def model_logical_tables(dynamic_tables: dict[str, Any],
                         tag_tables: dict[str, list[str]]) -> dict[str, str]:
    """{logical table: model storage} (a storage without recorded tags: its own name)."""
    return {name: storage for storage in dynamic_tables
            for name in tag_tables.get(storage) or [storage]}


def _whole(storage: str, meta_tables: dict[str, Any], tag_tables: dict[str, list[str]],
           resolved: ResolvedMap) -> bool:
    """Whether ``storage`` is restored as a whole, tag for tag: its tags are not known, or
    the checkpoint's storage of that name has no record and no table of it is mapped."""
    names = tag_tables.get(storage)
    if names is None:
        return True
    saved = meta_tables.get(storage)
    return (saved is not None and saved.get(TAG_TABLES) is None
            and all(resolved.source_table(name) == name for name in names))


def _note(outcome: Outcome, name: str, source: str) -> None:
    if source == name:
        outcome.restored.append(name)
    else:
        outcome.renamed[name] = source


def _plan_whole(storage: str, names: list[str], dim: int, meta_tables: dict[str, Any],
                resolved: ResolvedMap, outcome: Outcome) -> tuple[list[TableSource], set[str]]:
    """A storage matched by (mapped) storage name, loaded tag for tag."""
    source = resolved.source_table(storage)
    saved = meta_tables.get(source)
    if saved is None:
        outcome.missing.extend(names)
        return [], set()
    read = set(saved.get(TAG_TABLES) or [source])
    if int(saved["dim"]) != dim:
        outcome.differs.update({name: f"embedding_dim {dim} here, {saved['dim']} in the "
                                      f"checkpoint" for name in names})
        return [], read
    for name in names:
        _note(outcome, name, source if name == storage else name)
    return [TableSource(source, None)], read


def _add(remaps: dict[str, list[list[int]]], width: int, storage: str, saved_tag: int,
         tag: int) -> None:
    """Routes ``saved_tag`` of checkpoint ``storage`` to ``tag``: into the first remap of
    that storage where the saved tag is still free, else a new one (two tables of one
    storage may read the same checkpoint table)."""
    for remap in remaps.setdefault(storage, []):
        if remap[saved_tag] < 0:
            remap[saved_tag] = tag
            return
    remap = [-1] * width
    remap[saved_tag] = tag
    remaps[storage].append(remap)


def plan_by_name(names: list[str], dim: int, meta_tables: dict[str, Any],
                  resolved: ResolvedMap, kinds_differ: dict[str, str],
                  outcome: Outcome) -> tuple[list[TableSource], set[str]]:
    """A storage whose logical tables are each looked up by (mapped) name."""
    where = saved_logical_tables(meta_tables)
    remaps: dict[str, list[list[int]]] = {}
    read = set()
    for tag, name in enumerate(names):
        source = resolved.source_table(name)
        found = where.get(source)
        if found is None:
            if name in kinds_differ:
                outcome.differs[name] = kinds_differ[name]
            else:
                outcome.missing.append(name)
            continue
        read.add(source)
        saved, saved_tag = found
        if int(meta_tables[saved]["dim"]) != dim:
            outcome.differs[name] = (f"embedding_dim {dim} here, {meta_tables[saved]['dim']} "
                                     f"in the checkpoint")
            continue
        width = len(meta_tables[saved].get(TAG_TABLES) or [saved])
        _add(remaps, width, saved, saved_tag, tag)
        _note(outcome, name, source)
    sources = []
    for saved, storage_remaps in sorted(remaps.items()):
        for remap in storage_remaps:
            # tag for tag where the saved tags all keep their place (a recorded storage)
            same = remap == list(range(len(remap))) and TAG_TABLES in meta_tables[saved]
            sources.append(TableSource(saved, None if same else
                                       torch.tensor(remap, dtype=torch.int32)))
    return sources, read


def plan_tables(meta_tables: dict[str, Any], dynamic_tables: dict[str, Any],
                tag_tables: dict[str, list[str]], resolved: ResolvedMap,
                kinds_differ: dict[str, str]) -> tuple[dict[str, list[TableSource]], Outcome]:
    """({model storage: sources to load}, outcome of the logical tables).

    Args:
        meta_tables: the checkpoint's ``meta.json`` tables.
        dynamic_tables: {storage: HashTable} of the model.
        tag_tables: {storage: logical tables in tag order} of the model.
        resolved: the param map checked against model and checkpoint.
        kinds_differ: {table: why} of the model's tables that the checkpoint holds as
            another kind; they start empty.
    """
    outcome = Outcome()
    sources: dict[str, list[TableSource]] = {}
    read: set[str] = set()
    for storage in sorted(dynamic_tables):
        names = tag_tables.get(storage) or [storage]
        dim = int(dynamic_tables[storage].dim)
        if _whole(storage, meta_tables, tag_tables, resolved):
            sources[storage], found = _plan_whole(storage, names, dim, meta_tables, resolved,
                                                  outcome)
        else:
            sources[storage], found = plan_by_name(names, dim, meta_tables, resolved,
                                                    kinds_differ, outcome)
        read |= found
    outcome.unused = sorted(set(saved_logical_tables(meta_tables)) - read)
    return sources, outcome


def load_sources(meta_tables: dict[str, Any], storage: str, table: Any,
                 sources: list[TableSource], readers: dict[str, list[ShardReader]],
                 rank: int, world_size: int, restore_optimizer: bool,
                 keep_every_row: bool = False) -> dict[str, int]:
    """Loads model ``storage`` (``table``) from its checkpoint ``sources``, each read through
    ``readers[source.storage]``; its STEP clock is set to the latest of theirs.
    ``restore_optimizer`` False resets the optimizer-state columns; ``keep_every_row`` as
    in ``table_io.hold_rows``.

    Returns:
        {"rows": rows loaded, "admission": counters loaded} on this rank.
    """
    for source in sources:
        check_readers(readers[source.storage], storage, table, restore_optimizer)

    def fill() -> int:
        return sum(load_rows(readers[s.storage], table, rank, world_size, restore_optimizer,
                             s.remap) for s in sources)

    rows = (hold_rows(storage, table, fill, readers[sources[0].storage], rank, world_size,
                      keep_every_row) if sources else 0)
    counters = sum(load_admission(readers[s.storage], storage, table, rank, world_size, s.remap)
                   for s in sources)
    steps = [meta_tables[s.storage].get("table_step") for s in sources]
    steps = [int(step) for step in steps if step is not None]
    set_table_step(table, max(steps) if steps else None)
    return {"rows": rows, "admission": counters}

"""Applying incremental dumps (deltas) onto a full dump or a checkpoint.

The deltas are composed in memory first (a later delta's rows and evictions
override an earlier one's); they hold only changed entries, so they are small
next to the table. The base is then streamed chunk by chunk: entries evicted or
rewritten by a delta are dropped, every other entry is copied, and the composed
rows are appended to the shard of their owner under the base's world size. The
result is a ``kind: full`` dump at the last delta's step (table state only, no
dense files) that ``restore_checkpoint(path, None, None, tables)`` can load and
further deltas can be applied onto.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.identity import IdentityIndex
from hashrec.checkpoint.incremental import DUMP_PREFIX, EVICTED
from hashrec.checkpoint.restore import open_table_shards, read_complete_meta
from hashrec.checkpoint.save import clean_failed_save, commit_directory, prepare_temp_dir
from hashrec.checkpoint.shard_file import ShardReader, ShardWriter
from hashrec.checkpoint.table_io import ADMISSION, DEFAULT_CHUNK_ROWS, ROWS
from hashrec.checkpoint.tags import TAG_TABLES
from hashrec.table.hashing import owner_of

_ROW_FIELDS = ("keys", "tags", "rows", "scores")
_DTYPE_CHANGED = ("; its features' data_type changed between them: a run's dumps start with a "
                  "full one, apply that run's deltas onto it")


@dataclass
class _Composed:
    """The net effect of a sequence of deltas on one table."""

    rows: dict[str, torch.Tensor]  # keys, tags, rows, scores of entries to write
    removed_keys: torch.Tensor
    removed_tags: torch.Tensor


def _concat(readers: list[ShardReader], section: str, fields: tuple[str, ...]
            ) -> dict[str, torch.Tensor] | None:
    parts = [chunk for r in readers for chunk in r.iter_chunks(section)]
    if not parts:
        return None
    return {f: torch.cat([p[f] for p in parts]) for f in fields}


def _check_chain(base: str, base_meta: dict[str, Any],
                 delta_metas: list[tuple[str, dict[str, Any]]]) -> None:
    """The base must hold a whole table state and every delta must continue it exactly.

    A delta holds the entries changed since its ``base_step`` and the entries evicted
    since then, so it rebuilds the state at its ``step`` only from the state at its
    ``base_step``: applied to a later state (a checkpoint saved after that step) it
    would roll rows back, and to an earlier one it would miss changes.
    """
    if base_meta.get("kind") == "delta":
        raise CheckpointError(
            f"{base}: is a delta dump (changes since step {base_meta.get('base_step')}), not "
            f"a full state; pass the first full dump, an earlier output of apply_delta or a "
            f"checkpoint as --base")
    expected, source = base_meta["step"], base
    for path, meta in delta_metas:
        if meta.get("kind") != "delta":
            raise CheckpointError(f"{path}: is a {meta.get('kind', 'checkpoint')!r}, not a delta")
        if meta["base_step"] != expected:
            raise CheckpointError(
                f"{path}: delta against step {meta['base_step']}, but {source} is at step "
                f"{expected}; apply the deltas in order without gaps, starting from a base at "
                f"step {meta['base_step']} (its dump, or a checkpoint of that step)")
        missing = sorted(set(meta["tables"]) - set(base_meta["tables"]))
        if missing:
            raise CheckpointError(
                f"{path}: has tables {missing} that the base {base} lacks (it has "
                f"{sorted(base_meta['tables'])}); the base is from another model")
        expected, source = meta["step"], path


def _check_table(path: str, name: str, base: dict[str, Any], delta: dict[str, Any]) -> None:
    for field in ("dim", "row_dim", "dtype"):
        if base[field] != delta[field]:
            hint = _DTYPE_CHANGED if field == "dtype" else ""
            raise CheckpointError(f"{path}: table {name!r} has {field} {delta[field]}, the "
                                  f"base has {base[field]}{hint}")
    # Tags are positions; where both record their tables, they must name the same ones.
    if TAG_TABLES in base and TAG_TABLES in delta and base[TAG_TABLES] != delta[TAG_TABLES]:
        raise CheckpointError(
            f"{path}: table {name!r} holds {delta[TAG_TABLES]} in tag order, the base "
            f"{base[TAG_TABLES]}; they come from differently ordered feature configs")


def _compose(name: str, base_table: dict[str, Any],
             delta_metas: list[tuple[str, dict[str, Any]]]) -> _Composed:
    rows: dict[str, torch.Tensor] | None = None
    removed_keys = [torch.zeros(0, dtype=torch.int64)]
    removed_tags = [torch.zeros(0, dtype=torch.int32)]
    for path, meta in delta_metas:
        if name not in meta["tables"]:
            raise CheckpointError(f"{path}: has no table {name!r}")
        _check_table(path, name, base_table, meta["tables"][name])
        readers = open_table_shards(path, meta, name)
        new_rows = _concat(readers, ROWS, _ROW_FIELDS)
        evicted = _concat(readers, EVICTED, ("keys", "tags"))
        touched = [t for t in (new_rows, evicted) if t is not None]
        if rows is not None and touched:
            index = IdentityIndex(torch.cat([t["keys"] for t in touched]),
                                  torch.cat([t["tags"] for t in touched]))
            keep = index.find(rows["keys"], rows["tags"]) < 0
            rows = {f: v[keep] for f, v in rows.items()}
        if new_rows is not None:
            rows = new_rows if rows is None else {f: torch.cat([rows[f], new_rows[f]])
                                                  for f in _ROW_FIELDS}
        if evicted is not None:
            removed_keys.append(evicted["keys"])
            removed_tags.append(evicted["tags"])
    if rows is None:
        rows = {"keys": torch.zeros(0, dtype=torch.int64),
                "tags": torch.zeros(0, dtype=torch.int32), "rows": None,
                "scores": torch.zeros(0, dtype=torch.int64)}
    return _Composed(rows, torch.cat(removed_keys), torch.cat(removed_tags))


def _write_shard(reader: ShardReader, writer: ShardWriter, composed: _Composed,
                 drop: IdentityIndex, world_size: int, chunk_rows: int) -> None:
    writer.ensure_section(ROWS)
    for chunk in reader.iter_chunks(ROWS):
        keep = drop.find(chunk["keys"], chunk["tags"]) < 0
        if bool(keep.any()):
            writer.write_chunk(ROWS, {f: chunk[f][keep] for f in _ROW_FIELDS})
    rows = composed.rows
    if rows["rows"] is not None:
        mine = torch.nonzero(owner_of(rows["keys"], world_size) == reader.attrs["rank"])
        mine = mine.flatten()
        for start in range(0, int(mine.shape[0]), chunk_rows):
            sel = mine[start:start + chunk_rows]
            writer.write_chunk(ROWS, {f: rows[f][sel] for f in _ROW_FIELDS})
    if reader.has_section(ADMISSION):
        # a key the deltas wrote was admitted since the base (admission drops its counter)
        written = IdentityIndex(rows["keys"], rows["tags"])
        writer.ensure_section(ADMISSION)
        for chunk in reader.iter_chunks(ADMISSION):
            keep = written.find(chunk["keys"], chunk["tags"]) < 0
            if bool(keep.any()):
                writer.write_chunk(ADMISSION, {f: v[keep] for f, v in chunk.items()})


def _apply_table(tmp: str, name: str, base: str, base_meta: dict[str, Any],
                 delta_metas: list[tuple[str, dict[str, Any]]], chunk_rows: int
                 ) -> list[dict[str, Any]]:
    composed = _compose(name, base_meta["tables"][name], delta_metas)
    drop = IdentityIndex(torch.cat([composed.removed_keys, composed.rows["keys"]]),
                         torch.cat([composed.removed_tags, composed.rows["tags"]]))
    shards = []
    for reader in open_table_shards(base, base_meta, name):
        attrs = reader.attrs
        stem = layout.shard_stem(tmp, name, attrs["rank"], attrs["world_size"])
        writer = ShardWriter(stem, attrs)
        try:
            _write_shard(reader, writer, composed, drop, attrs["world_size"], chunk_rows)
        except BaseException:
            writer.abort()
            raise
        sections = writer.close()["sections"]
        shards.append({"stem": os.path.relpath(stem, tmp), "rows": sections[ROWS]["count"],
                       "admission": sections.get(ADMISSION, {}).get("count", 0)})
    return shards


def _base_kind(path: str) -> str:
    """What the base directory is called in an error, as far as its name tells."""
    name = os.path.basename(os.path.normpath(path))
    if name.startswith(DUMP_PREFIX):
        return "dump"
    return "checkpoint" if layout.is_checkpoint_name(name) else "full dump or checkpoint"


def apply_deltas(base: str, deltas: list[str], output: str,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> str:
    """Writes ``output``: the base dump or checkpoint with ``deltas`` applied in order.

    Args:
        base: a complete full dump, applied dump or checkpoint directory.
        deltas: complete delta directories, oldest first; the first one's base step is
            the base's step, each next one's the previous one's step.
        output: directory to create (must not exist).
        chunk_rows: rows per streamed chunk.

    Returns:
        ``output``.

    Raises:
        CheckpointError: a delta as the base, a delta that does not continue the base
            or the previous delta, tables missing from the base, corrupt files, or an
            existing ``output``.
    """
    if os.path.exists(output):
        raise CheckpointError(f"{output}: already exists; not overwritten")
    base_meta = read_complete_meta(base, _base_kind(base))
    delta_metas = [(path, read_complete_meta(path, "dump")) for path in deltas]
    _check_chain(base, base_meta, delta_metas)
    names = sorted(base_meta["tables"])
    tmp = output.rstrip(os.sep) + layout.TEMP_SUFFIX
    try:
        prepare_temp_dir(tmp, names)
    except OSError as err:  # a file where a folder of the path should be, no permission
        raise CheckpointError(f"cannot create {output}: {err.strerror}; name a new path in "
                              f"a directory you can write") from None
    try:  # a failure (a corrupt delta, a full disk, Ctrl-C) leaves no partial output
        _write_output(tmp, output, base, base_meta, delta_metas, chunk_rows)
    except BaseException:
        clean_failed_save(tmp, output)
        raise
    return output


def _write_output(tmp: str, output: str, base: str, base_meta: dict[str, Any],
                  delta_metas: list[tuple[str, dict[str, Any]]], chunk_rows: int) -> None:
    """Writes every table of the base with the deltas applied into ``tmp``, then commits
    it as ``output``."""
    tables = {}
    for name in sorted(base_meta["tables"]):
        shards = _apply_table(tmp, name, base, base_meta, delta_metas, chunk_rows)
        described = {k: v for k, v in base_meta["tables"][name].items() if k != "shards"}
        steps = [m["tables"][name].get("table_step") for _, m in delta_metas]
        steps = [step for step in steps if step is not None]
        if steps:  # the STEP clock of the last dump that recorded one
            described["table_step"] = steps[-1]
        tables[name] = {**described, "shards": shards,
                        "num_rows": sum(s["rows"] for s in shards)}
    step = delta_metas[-1][1]["step"] if delta_metas else base_meta["step"]
    meta = {
        "format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION, "kind": "full",
        "step": step, "base_step": None, "world_size": base_meta["world_size"],
        "created_unix": time.time(), "tables": tables,
        "dense": {"model": None, "optimizer": None}, "extra": base_meta.get("extra", {}),
    }
    parent = os.path.dirname(os.path.abspath(output))
    commit_directory(parent, tmp, output, meta)

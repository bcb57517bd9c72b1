"""Incremental dumps for online serving: rows changed since the last dump, plus evictions.

The table has no dirty-row hook, so the dumper finds changes itself: it keeps,
per table and rank, the (key, tag) and a 64-bit fingerprint of every row (bits
of the full row and the score) as of its previous dump, about 28 bytes per entry
on the host. A dump streams ``export_state`` once and writes

* ``rows``: entries that are new or whose row or score changed (full rows);
* ``evicted``: (key, tag) of entries present at the previous dump and gone now.

The first dump has no previous state and is therefore a full dump (so is the first
of a resumed run, which moves the dumps after its checkpoint's step aside first:
``discard_dumps_after``). Layout::

    output_dir/dump-<step>/meta.json  (kind "full" or "delta", step, base_step; <step> is
                                       zero-padded to 12 digits: dump-000000000200)
    output_dir/dump-<step>/dynamicemb/<table>/rank-<r>-of-<n>.{json,bin}
    output_dir/dump-<step>/DONE       written last

``python -m hashrec.tools.apply_delta`` applies deltas onto a full dump (or a
checkpoint). Each dump records its tables' STEP clocks (``table_step``), as checkpoints
do. Admission counters are not part of deltas: a dump or checkpoint with deltas applied
keeps its base's counters, less those of the keys the deltas wrote (admitted since).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.dist_util import gather_counts, rank_and_world, run_on_all_ranks
from hashrec.checkpoint.errors import CheckpointError, disk_full_hint
from hashrec.checkpoint.identity import IdentityIndex, row_fingerprint
from hashrec.checkpoint.save import (
    check_table_names,
    clean_failed_save,
    commit_directory,
    prepare_temp_dir,
)
from hashrec.checkpoint.shard_file import ShardWriter
from hashrec.checkpoint.table_io import DEFAULT_CHUNK_ROWS, ROWS, table_description

EVICTED = "evicted"
DUMP_PREFIX = "dump-"
DISCARDED_PREFIX = "discarded-"


@dataclass
class _Snapshot:
    """Entries of one table at the previous dump, sorted by identity hash."""

    index: IdentityIndex
    fingerprints: torch.Tensor  # aligned with index (sorted order)


def dump_path(output_dir: str, step: int) -> str:
    """``output_dir/dump-<step>`` (zero-padded so names sort by step)."""
    return os.path.join(output_dir, f"{DUMP_PREFIX}{step:012d}")


def discard_dumps_after(output_dir: str, step: int) -> str | None:
    """Move the dumps of steps after ``step`` (complete or not) into
    ``output_dir/discarded-<time>/``: a run resumed from the checkpoint of ``step``
    makes new ones, and a consumer must not apply the lost run's after them.

    Returns:
        The folder they went to, or None when there were none.
    """
    if not os.path.isdir(output_dir):
        return None
    later = []
    for name in sorted(os.listdir(output_dir)):
        digits = name[len(DUMP_PREFIX):].split(".", 1)[0]
        if name.startswith(DUMP_PREFIX) and digits.isdigit() and int(digits) > step:
            later.append(name)
    if not later:
        return None
    target = os.path.join(output_dir, f"{DISCARDED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}")
    suffix, unique = 0, target
    while os.path.exists(unique):
        suffix += 1
        unique = f"{target}-{suffix}"
    os.makedirs(unique)
    for name in later:
        os.replace(os.path.join(output_dir, name), os.path.join(unique, name))
    return unique


def _tags(tags: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(keys, dtype=torch.int32) if tags is None else tags.to(torch.int32)


class IncrementalDumper:
    """Writes a full dump, then on every ``interval_steps`` the changes since the last one.

    Call ``maybe_dump(step)`` on every rank after each training step (a collective
    under torch.distributed when it dumps).

    Args:
        output_dir: where ``dump-<step>`` directories go.
        dynamic_tables: {table name: HashTable} of this rank.
        interval_steps: steps between dumps (>= 1).
        chunk_rows: rows per streamed chunk.
        tag_tables: {table name: the logical table of each tag} of fused tables
            (``hashrec.checkpoint.tags.model_tag_tables``), recorded in the dumps.
    """

    def __init__(self, output_dir: str, dynamic_tables: dict[str, Any], interval_steps: int,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 tag_tables: dict[str, list[str]] | None = None) -> None:
        if isinstance(interval_steps, bool) or not isinstance(interval_steps, int) \
                or interval_steps < 1:
            raise ValueError(
                f"interval_steps={interval_steps!r} is not valid; allowed: an int >= 1")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows={chunk_rows!r} is not valid; allowed: >= 1")
        check_table_names(sorted(dynamic_tables))
        self.output_dir = output_dir
        self.tables = dict(dynamic_tables)
        self.interval_steps = interval_steps
        self.chunk_rows = chunk_rows
        self.tag_tables = dict(tag_tables or {})
        self.last_step: int | None = None
        self._snapshots: dict[str, _Snapshot] = {}

    def maybe_dump(self, step: int) -> str | None:
        """Dumps if this is the first call or ``interval_steps`` passed; returns the path."""
        if self.last_step is not None and step - self.last_step < self.interval_steps:
            return None
        return self.dump(step)

    def dump(self, step: int) -> str:
        """Writes ``dump-<step>`` now (full the first time, a delta afterwards).

        Call it on every rank (a collective under torch.distributed). A dump that fails
        removes what it wrote, so that the next dump (or a resumed run) finds no partial
        one, and says when the disk may be full.

        Raises:
            CheckpointError: ``step`` is not after the previous dump's, ``dump-<step>``
                exists already, or writing failed on any rank (on every rank).
        """
        if self.last_step is not None and step <= self.last_step:
            raise CheckpointError(
                f"dump step {step} is not after the previous dump's step {self.last_step}")
        rank, world_size = rank_and_world()
        names = sorted(self.tables)
        final = dump_path(self.output_dir, step)
        tmp = final + layout.TEMP_SUFFIX

        def prepare() -> None:
            if rank == 0:
                os.makedirs(self.output_dir, exist_ok=True)
                if os.path.exists(final):
                    raise CheckpointError(
                        f"{final}: already exists (a dump of another run); not overwritten: "
                        f"move it out of {self.output_dir} (as discard_dumps_after does) "
                        f"before dumping step {step} again")
                prepare_temp_dir(tmp, names)

        run_on_all_ranks(prepare, f"preparing {tmp}", CheckpointError)
        snapshots: dict[str, _Snapshot] = {}
        try:
            counts = run_on_all_ranks(
                lambda: self._write_rank(tmp, rank, world_size, snapshots),
                f"writing {tmp}", CheckpointError)
            all_counts = gather_counts(counts)
            meta = self._meta(step, world_size, all_counts)
            run_on_all_ranks(lambda: commit_directory(self.output_dir, tmp, final, meta)
                             if rank == 0 else None, f"committing {final}", CheckpointError)
        except CheckpointError as e:
            if rank == 0:  # every rank has stopped writing: run_on_all_ranks raised on all
                clean_failed_save(tmp, final)  # ``final`` did not exist before (prepare)
            raise CheckpointError(f"{e}{disk_full_hint(e)} (the partial dump of step {step} "
                                  f"was removed; the previous dumps are kept)") from e
        self._snapshots = snapshots
        self.last_step = step
        return final

    def _write_rank(self, tmp: str, rank: int, world_size: int,
                    snapshots: dict[str, _Snapshot]) -> list[int]:
        counts = []
        for name in sorted(self.tables):
            table = self.tables[name]
            stem = layout.shard_stem(tmp, name, rank, world_size)
            attrs = {"table": name, "rank": rank, "world_size": world_size,
                     **table_description(table, self.tag_tables.get(name))}
            writer = ShardWriter(stem, attrs)
            try:
                snapshots[name] = self._write_table(table, writer, self._snapshots.get(name))
            except BaseException:
                writer.abort()
                raise
            header = writer.close()
            counts += [header["sections"][ROWS]["count"], header["sections"][EVICTED]["count"]]
        return counts

    def _write_table(self, table: Any, writer: ShardWriter,
                     previous: _Snapshot | None) -> _Snapshot:
        writer.ensure_section(ROWS)
        writer.ensure_section(EVICTED)
        seen = None if previous is None else torch.zeros(len(previous.index), dtype=torch.bool)
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for keys, tags, rows, scores in table.export_state(self.chunk_rows):
            tags = _tags(tags, keys)
            keys_c, tags_c = keys.cpu(), tags.cpu()
            fps = row_fingerprint(rows, scores).cpu()
            changed = torch.ones(keys_c.shape[0], dtype=torch.bool)
            if previous is not None:
                pos = previous.index.find(keys_c, tags_c)
                hit = pos >= 0
                seen[pos[hit]] = True
                changed[hit] = previous.fingerprints[pos[hit]] != fps[hit]
            if bool(changed.any()):
                idx = torch.nonzero(changed).flatten().to(keys.device)
                writer.write_chunk(ROWS, {"keys": keys[idx], "tags": tags[idx],
                                          "rows": rows[idx], "scores": scores[idx].long()})
            parts.append((keys_c, tags_c, fps))
        if previous is not None:
            gone = torch.nonzero(~seen).flatten()
            for start in range(0, int(gone.shape[0]), self.chunk_rows):
                sel = gone[start:start + self.chunk_rows]
                writer.write_chunk(EVICTED, {"keys": previous.index.keys[sel],
                                             "tags": previous.index.tags[sel]})
        keys = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, dtype=torch.int64)
        tags = torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, dtype=torch.int32)
        fps = torch.cat([p[2] for p in parts]) if parts else torch.zeros(0, dtype=torch.int64)
        index = IdentityIndex(keys, tags)
        return _Snapshot(index=index, fingerprints=fps[index.order])

    def _meta(self, step: int, world_size: int, counts: list[list[int]]) -> dict[str, Any]:
        tables = {}
        for i, name in enumerate(sorted(self.tables)):
            shards = []
            for rank in range(world_size):
                stem = layout.shard_stem("", name, rank, world_size).lstrip(os.sep)
                shards.append({"stem": stem, "rows": counts[rank][2 * i],
                               "evicted": counts[rank][2 * i + 1]})
            tables[name] = {**table_description(self.tables[name], self.tag_tables.get(name)),
                            "shards": shards,
                            "num_rows": sum(s["rows"] for s in shards),
                            "table_step": getattr(self.tables[name], "step", None)}
        return {
            "format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION,
            "kind": "full" if self.last_step is None else "delta", "step": step,
            "base_step": self.last_step, "world_size": world_size,
            "created_unix": time.time(), "tables": tables,
            "dense": {"model": None, "optimizer": None}, "extra": {},
        }

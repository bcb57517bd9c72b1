"""Streaming dump of one dynamic table into a shard, and resharding load back.

A shard holds a ``rows`` section (keys int64, tags int32, full rows
``[embedding | optimizer state]``, scores int64, slots int64) and, for tables with
frequency admission, an ``admission`` section (keys, tags, counts, slots). Both go chunk
by chunk through ``HashTable.export_state`` / ``load_state``, so memory stays at one
chunk. The slots, with the table's ``num_buckets`` and ``bucket_capacity`` in the shard's
attributes, put each entry back where it was when a table of that geometry loads it (an
empty one grows to it first): a full bucket then evicts among equal scores as it would
have (the slot breaks that tie), so a resumed run evicts as an uninterrupted one. Shards
without slots (older checkpoints, applied dumps) load as inserts place entries.

Loading reads every shard of a table (saved on any number of ranks) and keeps
the entries this rank owns under the current world size
(``owner_of(keys, world_size) == rank``), so N saving ranks load on M ranks. Scores
mean what the saving table's score_strategy made them (a step, microseconds, a count):
a table of another strategy loads the rows with fresh scores (``initial_scores``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.pipeline import read_ahead
from hashrec.checkpoint.shard_file import ShardReader, ShardWriter, dtype_name
from hashrec.checkpoint.tags import TAG_TABLES, remap_chunk
from hashrec.table.hashing import owner_of
from hashrec.table.options import ScoreStrategy

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 1 << 20
ROWS = "rows"
ADMISSION = "admission"


def optimizer_description(spec: Any) -> dict[str, Any] | None:
    """JSON description of an optimizer spec: {"type": class name, "args": fields}."""
    if spec is None:
        return None
    return {"type": type(spec).__name__, "args": dataclasses.asdict(spec)}


def table_description(table: Any, tag_tables: list[str] | None = None) -> dict[str, Any]:
    """What a reader needs to check a shard against a table: dims, dtype, optimizer, and
    (when given) the logical table of each tag."""
    options = table.options
    described = {
        "dim": int(table.dim),
        "row_dim": int(table.row_dim),
        "dtype": dtype_name(options.dtype),
        "optimizer": optimizer_description(options.optimizer),
        "admission": options.admission is not None,
        "score_strategy": options.score_strategy.value,
    }
    if tag_tables is not None:
        described[TAG_TABLES] = list(tag_tables)
    return described


def initial_scores(table: Any, n: int) -> torch.Tensor:
    """Scores of rows a table did not see being trained: LFU 1, TIMESTAMP now, else 0."""
    strategy = table.options.score_strategy
    if strategy is ScoreStrategy.LFU:
        return torch.ones(n, dtype=torch.int64)
    if strategy is ScoreStrategy.TIMESTAMP:
        return torch.full((n,), time.time_ns() // 1000, dtype=torch.int64)
    return torch.zeros(n, dtype=torch.int64)


# What a score counts under each strategy (NO_EVICTION scores like STEP).
_SCORE_UNITS = {"STEP": "step", "NO_EVICTION": "step", "TIMESTAMP": "microseconds",
                "LFU": "accesses", "CUSTOMIZED": "the caller's"}


def other_score_strategy(readers: list[ShardReader], table: Any) -> str | None:
    """The score_strategy the shards of ``readers`` were saved with where its scores mean
    something else in ``table`` (LFU counts read as steps, say), else None (also for
    shards that do not record it)."""
    saved = {r.attrs.get("score_strategy") for r in readers} - {None}
    wanted = _SCORE_UNITS[table.options.score_strategy.value]
    return next((s for s in sorted(saved) if _SCORE_UNITS.get(s, s) != wanted), None)


def _tags_or_zeros(tags: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    if tags is None:
        return torch.zeros(keys.shape[0], dtype=torch.int32)
    return tags.to(torch.int32)


def dump_table(table: Any, stem: str, attrs: dict[str, Any],
               chunk_rows: int = DEFAULT_CHUNK_ROWS) -> dict[str, Any]:
    """Writes ``table``'s rows and admission counters to the shard ``stem``.

    Returns:
        The shard header (counts per section).
    """
    geometry = {"num_buckets": int(table.storage.num_buckets),
              "bucket_capacity": int(table.storage.bucket_capacity)}
    writer = ShardWriter(stem, {**attrs, **table_description(table), **geometry})
    try:
        writer.ensure_section(ROWS)
        for keys, tags, rows, scores, slots in table.export_state(chunk_rows, slots=True):
            writer.write_chunk(ROWS, {
                "keys": keys, "tags": _tags_or_zeros(tags, keys), "rows": rows,
                "scores": scores.to(torch.int64), "slots": slots.to(torch.int64)})
        if table.options.admission is not None:
            writer.ensure_section(ADMISSION)
            keys, tags, counts, slots = table.admission_state(slots=True)
            tags = _tags_or_zeros(tags, keys)
            for start in range(0, int(keys.shape[0]), chunk_rows):
                end = start + chunk_rows
                writer.write_chunk(ADMISSION, {
                    "keys": keys[start:end], "tags": tags[start:end],
                    "counts": counts[start:end].to(torch.int64),
                    "slots": slots[start:end].to(torch.int64)})
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def check_compatible(reader: ShardReader, name: str, table: Any,
                     restore_optimizer: bool) -> None:
    """Raises CheckpointError if the shard cannot be loaded into ``table``."""
    saved = reader.attrs
    where = f"{reader.stem}.json (table {name!r})"
    if saved.get("dim") != table.dim:
        tables = f" of {saved[TAG_TABLES]}" if saved.get(TAG_TABLES) else ""
        raise CheckpointError(
            f"{where}: embedding dim {saved.get('dim')} in the checkpoint, {table.dim} in the "
            f"model (the embedding_dim{tables} in the feature configs); restore with the "
            f"feature configs it was saved with (the model_dir's pipeline.config)")
    if not restore_optimizer:
        return
    wanted = optimizer_description(table.options.optimizer)
    saved_type = (saved.get("optimizer") or {}).get("type")
    wanted_type = (wanted or {}).get("type")
    if saved_type != wanted_type or saved.get("row_dim") != table.row_dim:
        raise CheckpointError(
            f"{where}: sparse optimizer {saved_type} (row_dim {saved.get('row_dim')}) in the "
            f"checkpoint, {wanted_type} (row_dim {table.row_dim}) in the model; restore "
            f"without optimizer state (--ignore_restore_optimizer) to reset it")


def log_dtype_conversion(table: str, saved: str, wanted: str) -> None:
    """One INFO line: ``table``'s rows, saved as ``saved``, load converted to ``wanted``."""
    logger.info("table %r: rows saved as %s are converted to %s, the dtype the model's "
                "table stores (its features' data_type)", table, saved, wanted)


def _initial_state_columns(table: Any) -> torch.Tensor:
    spec = table.options.optimizer
    if spec is None:
        return torch.zeros(0)
    return spec.initial_state(table.dim).reshape(-1)


def _adapt_rows(rows: torch.Tensor, table: Any, restore_optimizer: bool) -> torch.Tensor:
    """Saved full rows -> rows for ``table``; state columns reset unless restored."""
    if not restore_optimizer:
        state = _initial_state_columns(table).to(rows.dtype)
        embeddings = rows[:, :table.dim]
        rows = torch.cat([embeddings, state.expand(rows.shape[0], state.shape[0])], dim=1)
    return rows.to(dtype=table.options.dtype, device=table.device)


def _owned(keys: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return owner_of(keys, world_size) == rank


def iter_owned_rows(readers: list[ShardReader], rank: int, world_size: int,
                    pin_memory: bool = False, remap: torch.Tensor | None = None
                    ) -> Iterator[dict[str, torch.Tensor]]:
    """Yields chunks of the ``rows`` sections of ``readers`` reduced to owned keys, with
    tags mapped by ``remap`` (see ``hashrec.checkpoint.tags.tag_remap``)."""
    for reader in readers:
        for chunk in reader.iter_chunks(ROWS, pin_memory=pin_memory):
            chunk = remap_chunk(chunk, remap)
            if world_size == 1:
                if chunk["keys"].numel():
                    yield chunk
                continue
            mask = _owned(chunk["keys"], rank, world_size)
            if bool(mask.all()):
                yield chunk
            elif bool(mask.any()):
                yield {k: v[mask] for k, v in chunk.items()}


def load_table(readers: list[ShardReader], name: str, table: Any, rank: int,
               world_size: int, restore_optimizer: bool = True,
               remap: torch.Tensor | None = None, check_held: bool = True,
               keep_every_row: bool = False) -> dict[str, int]:
    """Loads the owned entries of every shard in ``readers`` into ``table``.

    Rows saved in another dtype than the table's (a feature's ``data_type`` changed since
    the save) are converted, with one INFO line. The next chunk is read and verified on a
    background thread while the table inserts the current one (read into page-locked
    memory for a CUDA table). A ``rows`` section holds each (key, tag) once (an export
    of one table), so the table skips deduplication. ``remap`` maps saved tags to the
    table's tags (tables of a fused storage matched by name); None loads tags as saved.
    ``check_held``: check that a table that started empty holds every row
    (``hold_rows``); a caller loading several checkpoint tables into one checks
    after the last. ``keep_every_row``: see ``hold_rows``.

    Returns:
        {"rows": rows loaded, "admission": counters loaded}.

    Raises:
        CheckpointError: incompatible dims/optimizer, corrupt data, or a NO_EVICTION
            table too small to hold the rows (checked when the table started empty;
            another table keeps the highest-scored rows, with a warning:
            ``check_all_held``).
    """
    check_readers(readers, name, table, restore_optimizer)

    def fill() -> int:
        return load_rows(readers, table, rank, world_size, restore_optimizer, remap)

    rows = (hold_rows(name, table, fill, readers, rank, world_size, keep_every_row)
            if check_held else fill())
    counters = load_admission(readers, name, table, rank, world_size, remap)
    return {"rows": rows, "admission": counters}


def check_readers(readers: list[ShardReader], name: str, table: Any,
                  restore_optimizer: bool) -> None:
    """Checks that the shards of ``readers`` fit ``table`` (``check_compatible``) and logs a
    dtype conversion once."""
    for reader in readers:
        check_compatible(reader, name, table, restore_optimizer)
    wanted = dtype_name(table.options.dtype)
    saved = sorted({str(r.attrs.get("dtype", wanted)) for r in readers} - {wanted})
    if saved:
        log_dtype_conversion(name, "/".join(saved), wanted)
    strategy = other_score_strategy(readers, table)
    if strategy is not None:
        logger.warning("table %r: rows saved under score_strategy %s load with fresh %s "
                       "scores (saved scores count %s)", name, strategy,
                       table.options.score_strategy.value, _SCORE_UNITS.get(strategy, strategy))


def load_rows(readers: list[ShardReader], table: Any, rank: int, world_size: int,
              restore_optimizer: bool, remap: torch.Tensor | None = None) -> int:
    """Loads the owned rows of ``readers`` into ``table`` (checked first with
    ``check_readers``); returns how many. A load that takes longer than
    ``PROGRESS_INTERVAL_S`` logs its progress that often, and its end."""
    loaded = 0
    device = torch.device(table.device)
    pinned = device.type == "cuda"
    fresh_scores = other_score_strategy(readers, table) is not None
    _grow_to_saved(readers, table)
    progress = _LoadProgress(table.options.name, sum(r.count(ROWS) for r in readers))
    for chunk in read_ahead(iter_owned_rows(readers, rank, world_size, pinned, remap)):
        rows = _adapt_rows(chunk["rows"], table, restore_optimizer)
        slots = chunk.get("slots")
        scores = (initial_scores(table, int(chunk["keys"].shape[0])) if fresh_scores
                  else chunk["scores"])
        # synchronous copies: the page-locked chunk is freed (and reused) right after
        table.load_state(chunk["keys"].to(device), chunk["tags"].to(device), rows,
                         scores.to(device), assume_unique=True,
                         slots=None if slots is None else slots.to(device))
        loaded += int(chunk["keys"].shape[0])
        progress.note(loaded)
    progress.end(loaded)
    return loaded


# Seconds between two progress lines of a table's load (none for a shorter load).
PROGRESS_INTERVAL_S = 10.0


class _LoadProgress:
    """INFO lines of a long table load: the rows loaded so far, every
    ``PROGRESS_INTERVAL_S``, then the total."""

    def __init__(self, name: str, saved: int) -> None:
        self._name, self._saved = name, saved
        self._start = self._last = time.monotonic()

    def note(self, loaded: int) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            logger.info("table %r: %d rows loaded in %.0fs (the checkpoint holds %d, over "
                        "all ranks)", self._name, loaded, now - self._start, self._saved)

    def end(self, loaded: int) -> None:
        took = time.monotonic() - self._start
        if took >= PROGRESS_INTERVAL_S:
            logger.info("table %r: %d rows loaded in %.1fs", self._name, loaded, took)


def _grow_to_saved(readers: list[ShardReader], table: Any) -> None:
    """An empty table grows to the bucket count its shards were saved from, where that
    is on its way to max_capacity, so that each saved row can go back to its slot (an
    exact layout: ``HashTable.load_state(slots=)``; a row whose slot does not fit is
    placed as inserts place it)."""
    counts = {(r.attrs.get("num_buckets"), r.attrs.get("bucket_capacity")) for r in readers}
    if len(counts) != 1 or int(table.size()) != 0:
        return
    num_buckets, bucket_capacity = counts.pop()
    if num_buckets is not None and bucket_capacity == table.storage.bucket_capacity:
        table.grow_to(int(num_buckets))


# Doublings past max_capacity a restore that keeps every row makes at most. The first
# takes a full table to half its buckets' room, where 128-slot buckets overflow only
# by chance; small buckets may need another.
MAX_WIDENINGS = 3


def hold_rows(name: str, table: Any, fill: Callable[[], int], readers: list[ShardReader],
              rank: int = 0, world_size: int = 1, keep_every_row: bool = False) -> int:
    """Runs ``fill`` (it loads rows into ``table`` and returns how many) and, where the
    table started empty, checks that it holds every row (``check_all_held``).

    ``keep_every_row`` (a restore for evaluation or export, where nothing trains): a
    table that does not hold every row grows past max_capacity
    (``HashTable.grow_past_max_capacity``, twice the buckets) and ``fill`` runs again,
    up to ``MAX_WIDENINGS`` times, with an INFO line naming the slots it took; the rows
    it still cannot hold go as ``check_all_held`` says.

    Returns:
        The rows loaded (by the last ``fill``).
    """
    if int(table.size()) != 0:
        return fill()
    # The rows a full bucket refuses are reported here (check_all_held), not by the table
    with table.refusals_counted_only():
        loaded = fill()
    widened = 0
    while keep_every_row and int(table.size()) < loaded and widened < MAX_WIDENINGS:
        held, capacity = int(table.size()), int(table.capacity())
        table.grow_past_max_capacity()
        widened += 1
        with table.refusals_counted_only():
            loaded = fill()
        max_capacity = int(table.options.max_capacity)
        why = ("fewer slots than rows" if loaded > capacity else "the keys fill its buckets "
               "unevenly: another number of ranks or bucket_capacity than the checkpoint's")
        logger.info(
            "table %r%s: %d of the %d rows it owns fit its %d slots (max_capacity %d; %s); "
            "grown to %d slots, past max_capacity, to hold every row (nothing trains here): "
            "it holds %d", name, f" on rank {rank} of {world_size}" if world_size > 1 else "",
            held, loaded, capacity, max_capacity, why, int(table.capacity()),
            int(table.size()))
    check_all_held(name, table, loaded, readers, rank, world_size)
    return loaded


def check_all_held(name: str, table: Any, loaded: int, readers: list[ShardReader],
                   rank: int = 0, world_size: int = 1) -> int:
    """Reports the rows of ``readers`` that ``table``, empty before ``loaded`` rows went in,
    does not hold. Their keys fall into buckets that were full (the checkpoint's table
    was nearly full, and the keys spread over the buckets otherwise under another number
    of ranks, or max_capacity is smaller now): there, as in training, the lowest score
    gave way (evicted, or refused where the incoming row scored lowest). That is a
    WARNING per table naming the rows loaded, held and lost, and loading goes on: under
    any number of ranks the highest-scored rows of each bucket are kept.

    Returns:
        The rows not held (0 when the table holds every row loaded).

    Raises:
        CheckpointError: rows were lost in a table whose score_strategy is NO_EVICTION:
            it refused rows in the order they were read, not by score, and never drops
            a row it holds, so the loss would break its promise.
    """
    held = int(table.size())
    lost = loaded - held
    if lost <= 0:
        return 0
    source = os.path.dirname(readers[0].stem) if readers else "the checkpoint"
    where = f" on rank {rank} of {world_size}" if world_size > 1 else ""
    capacity = int(table.options.max_capacity)
    room = f"room for {capacity}" + (
        "" if loaded > capacity else ", but the keys fill its buckets unevenly")
    advice = ("raise its max_capacity (the dynamicemb.max_capacity of its features, counted "
              "over all ranks)")
    if table.options.score_strategy is ScoreStrategy.NO_EVICTION:
        raise CheckpointError(
            f"table {name!r}{where}: {loaded} rows of {source} belong here but the table "
            f"holds {held} ({room}) and, with score_strategy NO_EVICTION, refused the other "
            f"{lost} in the order they were read; {advice}")
    logger.warning(
        "table %r%s: %d rows of %s belong here, the table holds %d (%s): the %d rows "
        "(%.1f%%) that scored lowest in full buckets are not restored, as training would "
        "evict them; %s to keep every row", name, where, loaded, source, held, room, lost,
        100.0 * lost / loaded, advice)
    return lost


def set_table_step(table: Any, saved_step: int | None) -> None:
    """Puts a table's STEP clock back where it was, if the table exposes a setter."""
    if saved_step is None or not hasattr(table, "step"):
        return
    try:
        table.step = saved_step
    except AttributeError:
        while int(table.step) < saved_step and hasattr(table, "advance_step"):
            table.advance_step()


def load_admission(readers: list[ShardReader], name: str, table: Any, rank: int,
                    world_size: int, remap: torch.Tensor | None) -> int:
    if not any(r.count(ADMISSION) for r in readers):
        return 0
    if table.options.admission is None:
        logger.warning("table %r: checkpoint has admission counters but the table has no "
                       "admission; counters ignored", name)
        return 0
    loaded = 0
    device = table.device
    for reader in readers:
        for chunk in reader.iter_chunks(ADMISSION):
            chunk = remap_chunk(chunk, remap)
            mask = _owned(chunk["keys"], rank, world_size)
            if bool(mask.any()):
                slots = chunk.get("slots")
                table.load_admission_state(chunk["keys"][mask].to(device),
                                           chunk["tags"][mask].to(device),
                                           chunk["counts"][mask].to(device),
                                           None if slots is None else slots[mask].to(device))
                loaded += int(mask.sum())
    return loaded

"""Iterable datasets that read parquet or CSV files into :class:`Batch` objects.

Each DataLoader worker of each rank reads its own share of the rows (see
:mod:`hashrec.data.sharding`: a contiguous slice), cuts it into batches, parses every batch
with the feature set and yields the parsed :class:`Batch`; the DataLoader runs
with ``batch_size=None`` so batches pass through unchanged. Workers hand batches to
the main process through reused shared buffers (:mod:`hashrec.data.transfer`),
and a DataError as a :class:`WorkerFailure` item.

Errors about a row name the file and the row in it, counted from 0 (a CSV
header line not counted).
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import IterableDataset, get_worker_info

from hashrec.data.batching import rebatch, shuffle_rebatch
from hashrec.data.errors import DataError
from hashrec.data.schema import common_schema, conform, integers_read_as_text
from hashrec.data.sharding import epoch_order, slot_batches, slot_ranges
from hashrec.data.sources import CsvFormat, CsvSource, ParquetSource, Piece
from hashrec.data.transfer import BatchSender
from hashrec.features.errors import FeatureError

logger = logging.getLogger("hashrec.data")

# Hidden columns telling where each buffered row came from (for error messages): the
# index of one of its file's pieces, and its row in that file.
_FILE_COLUMN = "__hashrec_file__"
_ROW_COLUMN = "__hashrec_row__"


@dataclass(frozen=True)
class WorkerFailure:
    """A DataError raised in a DataLoader worker, sent to the main process as an item.

    The DataLoader would re-raise a worker's exception in the main process as a new
    exception whose message is the worker's whole traceback; sent as an item, the
    error arrives as raised (type and message), and the loader raises it there
    (``hashrec.data.loader``).
    """

    error: DataError


@dataclass(frozen=True)
class ReadOptions:
    """How a dataset walks its rows.

    Attributes:
        batch_size: rows per batch (the last batch of each reader may be smaller).
        shuffle: permute the piece order per epoch and shuffle rows through a buffer.
        shuffle_buffer_size: shuffle buffer size in batches (0: no buffer, rows keep
            their order within the shuffled pieces).
        drop_remainder: drop each reader's last, partial batch.
        num_epochs: passes over the data in one iteration (None: without end, with
            ``tag_epochs`` only).
        seed: seed of the shuffles (same seed and layout -> same batches).
        tag_epochs: yield ``(epoch, batch)`` pairs for a training stream that runs
            from one epoch into the next without restarting its readers. Pass ``p`` is
            epoch ``seed + p`` and reads exactly as a one-pass reader with that seed;
            every reader of a rank yields the same number of items per pass (its
            batches, then ``None`` fillers), so a DataLoader's round robin over its
            workers never mixes two epochs.
        rank: this process's rank.
        world_size: number of ranks that split the rows.
        with_labels: parse label fields (False for prediction).
        reserved_columns: columns passed through untouched in ``Batch.reserved``.
    """

    batch_size: int = 1024
    shuffle: bool = False
    shuffle_buffer_size: int = 32
    drop_remainder: bool = False
    num_epochs: int | None = 1
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    with_labels: bool = True
    reserved_columns: tuple[str, ...] = ()
    tag_epochs: bool = False

    def __post_init__(self) -> None:
        if self.shuffle_buffer_size < 0:
            raise ValueError(f"shuffle_buffer_size must be >= 0, got {self.shuffle_buffer_size}")
        for name in ("batch_size", "num_epochs", "world_size"):
            value = getattr(self, name)
            if name == "num_epochs" and value is None and self.tag_epochs:
                continue
            if value is None or value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), "
                             f"got {self.rank}")


class FileDataset(IterableDataset):
    """Rows of ``files`` parsed into Batch objects by ``feature_set``.

    Args:
        files: data files (see :func:`hashrec.data.paths.expand_input_path`).
        feature_set: has ``input_columns``, ``feature_columns``, ``target_columns``,
            ``column_notes`` and ``parse(table, with_labels) -> Batch``.
        options: how to walk the rows.
        source: the file format.
        pin_memory: the loader pins batches (workers then hand them over in
            pinned memory directly).
        sampler: a ``hashrec.data.sampler.NegativeSampler`` whose negative rows follow
            each batch's (``Batch.negatives``), or a ``hashrec.data.tdm_sampler.TDMSampler``
            whose (user, tree node) rows follow the batch's rows in the batch itself;
            drawn from a generator seeded by the options' seed, the epoch and the reader;
            None for none.

    Files without rows are skipped (with a warning, on rank 0). Every file is read as the files'
    common schema (:func:`hashrec.data.schema.common_schema`), whatever their order.

    Raises:
        DataError: a file is unreadable or lacks a needed column, a column's types in
            two files have no common type, or no file has rows.
    """

    def __init__(self, files: Sequence[str], feature_set, options: ReadOptions, source,
                 pin_memory: bool = False, sampler=None) -> None:
        super().__init__()
        self.sampler = sampler
        self.feature_set = feature_set
        self.options = options
        self.source = source
        self.pin_memory = pin_memory
        self.pieces: list[Piece] = []
        schemas, empty = [], []
        for path in files:
            pieces, schema = source.pieces(path)
            if not pieces:  # Spark writes one such file per empty partition
                empty.append(path)
                continue
            self.pieces.extend(pieces)
            schemas.append((path, schema))
        self.num_rows = sum(p.num_rows for p in self.pieces)
        if not self.pieces:
            more = f" and {len(empty) - 1} other files" if len(empty) > 1 else ""
            raise DataError(f"{empty[0]}{more}: no rows in the input (every file is empty); "
                            f"check the input path")
        if empty and options.rank == 0:  # every rank lists the same input: say it once
            logger.warning("skipping %d of %d input files that have no rows (first: %s)",
                           len(empty), len(files), empty[0])
        # Every piece is cast to it, so that batches spanning files concatenate.
        self.schema: pa.Schema = common_schema(schemas)
        if options.rank == 0:
            for note in integers_read_as_text(schemas, self.schema):
                logger.warning("%s", note)

    @staticmethod
    def needed_columns(feature_set, options: ReadOptions, sampler=None) -> list[str]:
        """Columns to read: the features' inputs (labels and the sample weight only when
        parsed, unless a feature reads them too: a PEPNet's domain label), reserved ones
        and the sampler's item id (and user id, of a sampler with edge tables)."""
        labels = set(feature_set.target_columns) - set(feature_set.feature_columns)
        columns = [c for c in feature_set.input_columns
                   if options.with_labels or c not in labels]
        ids = [] if sampler is None else [sampler.item_id_field,
                                          getattr(sampler, "user_id_field", "")]
        return list(dict.fromkeys([*columns, *options.reserved_columns, *filter(None, ids)]))

    def _chunks(self, ranges, use_threads: bool) -> Iterator[pa.Table]:
        """The rows of the (piece, start, stop) ``ranges``, with the hidden origin columns;
        consecutive ranges of one piece are read in one pass."""
        paths = {p.path: i for i, p in enumerate(self.pieces)}
        for piece, group in itertools.groupby(ranges, key=operator.itemgetter(0)):
            spans = [(start, stop) for _, start, stop in group]
            for start, table in self.source.read_spans(piece, spans, use_threads):
                table = conform(table, self.schema, piece.path)
                tag = pa.array(np.full(table.num_rows, paths[piece.path], dtype=np.int32))
                first = piece.first_row + start
                rows = pa.array(np.arange(first, first + table.num_rows, dtype=np.int64))
                yield table.append_column(_FILE_COLUMN, tag).append_column(_ROW_COLUMN, rows)

    def _parse(self, table: pa.Table, sample_rng: np.random.Generator | None = None):
        origin = table.select([_FILE_COLUMN, _ROW_COLUMN])
        table = table.drop_columns([_FILE_COLUMN, _ROW_COLUMN]).combine_chunks()
        sampled = {}
        if getattr(self.sampler, "expands_rows", False):  # a TDM's rows follow the block's
            table = self.sampler.expand(table, sample_rng)
        elif self.sampler is not None:
            drawn = self.sampler.sample(table, sample_rng)
            # a hard-negative sampler's draw is (rows, mask): hashrec.data.edge_sampler
            sampled = {"negatives": drawn} if isinstance(drawn, pa.Table) else \
                {"negatives": drawn[0], "hard_negatives": drawn[1]}
        try:
            batch = self.feature_set.parse(table, with_labels=self.options.with_labels,
                                           **sampled)
        except Exception as e:
            raise self._parse_error(e, origin) from e
        if self.options.reserved_columns:
            batch.reserved = {c: table.column(c) for c in self.options.reserved_columns}
        return batch

    def _parse_error(self, error: Exception, origin: pa.Table) -> DataError:
        """The DataError for ``error`` raised parsing a block whose rows came from
        ``origin`` (hidden columns): naming the file and the row in it when ``error``
        names a row of the block, else the files the block read."""
        files = origin.column(_FILE_COLUMN)
        row = error.row if isinstance(error, FeatureError) else None
        if row is not None and 0 <= row < origin.num_rows:
            path = self.pieces[files[row].as_py()].path
            file_row = origin.column(_ROW_COLUMN)[row].as_py()
            return DataError(f"{path}: {error.subject} row {file_row}: {error.detail}")
        names = ", ".join(sorted({self.pieces[i].path for i in pc.unique(files).to_pylist()}))
        if isinstance(error, FeatureError):  # says what is wrong in the data
            return DataError(f"{names}: {error}")
        return DataError(f"parsing a batch with rows from {names} failed: "
                         f"{type(error).__name__}: {error}")

    def __iter__(self):
        info = get_worker_info()
        main_process = info is None
        worker, workers = (0, 1) if main_process else (info.id, info.num_workers)
        sender = None if main_process else BatchSender(self.pin_memory)
        try:
            yield from self._batches(worker, workers, main_process, sender)
        except DataError as e:
            if main_process:
                raise
            yield WorkerFailure(e)
        finally:
            if sender is not None:
                sender.close()

    def reader_batches(self, rank: int, num_workers: int) -> list[int]:
        """Batches each reader (DataLoader worker; one without workers) of ``rank``
        yields per pass, from the row count alone."""
        opts = self.options
        workers = max(num_workers, 1)
        slots = opts.world_size * workers
        return [slot_batches(self.num_rows, rank * workers + w, slots, opts.batch_size,
                             opts.drop_remainder)
                for w in range(workers)]

    def reader_rows(self, rank: int, num_workers: int) -> list[int]:
        """Rows each reader of ``rank`` reads per pass (before dropping a remainder):
        contiguous slices in file order, reader 0's first."""
        workers = max(num_workers, 1)
        return [sum(stop - start for _, start, stop in self._ranges(self.pieces, w, workers,
                                                                     rank))
                for w in range(workers)]

    def _ranges(self, order: Sequence[Piece], worker: int, workers: int,
                rank: int | None = None) -> list[tuple[Piece, int, int]]:
        """The (piece, start, stop) row ranges that ``worker`` of ``workers`` of ``rank``
        (None: this rank) reads from the pieces in ``order``."""
        opts = self.options
        rank = opts.rank if rank is None else rank
        return slot_ranges(order, rank * workers + worker, opts.world_size * workers,
                           opts.batch_size)

    def _batches(self, worker: int, workers: int, main_process: bool, sender):
        opts = self.options
        passes = itertools.count() if opts.num_epochs is None else range(opts.num_epochs)
        slot = opts.rank * workers + worker
        items = 0
        if opts.tag_epochs:  # every reader of the rank: the most batches of any of them
            items = max(self.reader_batches(opts.rank, workers))
        # Workers read single-threaded: the DataLoader already runs one per core.
        for p in passes:
            seed, epoch = (opts.seed + p, 0) if opts.tag_epochs else (opts.seed, p)
            order = epoch_order(self.pieces, opts.shuffle, seed, epoch)
            chunks = self._chunks(self._ranges(order, worker, workers), main_process)
            if opts.shuffle and opts.shuffle_buffer_size:
                rng = np.random.default_rng([seed, epoch, slot])
                tables = shuffle_rebatch(chunks, opts.batch_size, opts.drop_remainder,
                                         opts.batch_size * opts.shuffle_buffer_size, rng)
            else:
                tables = rebatch(chunks, opts.batch_size, opts.drop_remainder)
            count = 0
            sample_rng = np.random.default_rng([seed, epoch, slot, 1])
            for table in tables:
                batch = self._parse(table, sample_rng)
                item = batch if sender is None else sender.pack(batch)
                yield (seed, item) if opts.tag_epochs else item
                count += 1
            if opts.tag_epochs:
                if count > items:
                    raise DataError(f"a reader yielded {count} batches in epoch {seed}, more "
                                    f"than the {items} its row count allows")
                for _ in range(items - count):
                    yield seed, None


class ParquetDataset(FileDataset):
    """Parquet files; row groups are the unit of reading."""

    def __init__(self, files: Sequence[str], feature_set, options: ReadOptions,
                 pin_memory: bool = False, sampler=None) -> None:
        source = ParquetSource(self.needed_columns(feature_set, options, sampler),
                               feature_set.column_notes)
        super().__init__(files, feature_set, options, source, pin_memory, sampler)


class CsvDataset(FileDataset):
    """Delimited text files laid out as ``fmt`` says."""

    def __init__(self, files: Sequence[str], feature_set, options: ReadOptions,
                 fmt: CsvFormat, pin_memory: bool = False, sampler=None) -> None:
        source = CsvSource(self.needed_columns(feature_set, options, sampler), fmt,
                           feature_set.column_notes)
        super().__init__(files, feature_set, options, source, pin_memory, sampler)


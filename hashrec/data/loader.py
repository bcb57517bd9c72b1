"""Build a DataLoader of :class:`Batch` objects from a DataConfig."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import warnings
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from hashrec.data.dataset import (
    CsvDataset,
    FileDataset,
    ParquetDataset,
    ReadOptions,
    WorkerFailure,
)
from hashrec.data.errors import DataError
from hashrec.data.paths import expand_input_path
from hashrec.data.sampler import negative_sampler
from hashrec.data.sources import CsvFormat, CsvSource, ParquetSource

MODES = ("train", "eval", "predict")
DATASET_TYPES = ("ParquetDataset", "CsvDataset")


def _enum_name(message, field: str) -> str:
    """Name of an enum field of a protobuf message (or the value itself if it is a str)."""
    value = getattr(message, field)
    if isinstance(value, str):
        return value
    descriptor = getattr(message, "DESCRIPTOR", None)
    if descriptor is None:
        return str(value)
    return descriptor.fields_by_name[field].enum_type.values_by_number[value].name


def _has(message, field: str) -> bool:
    has_field = getattr(message, "HasField", None)
    if has_field is None:
        return getattr(message, field, None) is not None
    return has_field(field)


def csv_format(data_config) -> CsvFormat:
    """The CSV layout a DataConfig describes (input_fields, delimiter, with_header).

    Raises:
        DataError: the layout is invalid (the message names the data_config field).
    """
    fields = tuple(
        (f.input_name, _enum_name(f, "input_type") if _has(f, "input_type") else None)
        for f in data_config.input_fields)
    try:
        return CsvFormat(fields, data_config.delimiter, bool(data_config.with_header))
    except ValueError as err:
        raise DataError(f"data_config (CsvDataset): {err}") from None


def read_options(data_config, mode: str, rank: int = 0, world_size: int = 1,
                 batch_size: int | None = None, reserved_columns: Sequence[str] = (),
                 num_epochs: int | None = 1, seed: int = 0,
                 tag_epochs: bool = False) -> ReadOptions:
    """ReadOptions for ``mode``: train shuffles and drops remainders as configured;
    eval and predict read every row once. Each worker reads a contiguous slice of the
    rows in file order, and the loader interleaves the workers' batches
    (``reader_turns`` tells which worker each comes from)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "train" and (num_epochs != 1 or tag_epochs):
        raise ValueError(f"{mode} mode reads one untagged pass, got num_epochs={num_epochs}, "
                         f"tag_epochs={tag_epochs}")
    train = mode == "train"
    size = batch_size or (None if train else getattr(data_config, "eval_batch_size", None))
    return ReadOptions(
        batch_size=size or data_config.batch_size,
        shuffle=train and bool(getattr(data_config, "shuffle", False)),
        shuffle_buffer_size=getattr(data_config, "shuffle_buffer_size", 32),
        drop_remainder=train and bool(data_config.drop_remainder),
        num_epochs=num_epochs, seed=seed, rank=rank, world_size=world_size,
        with_labels=mode != "predict", reserved_columns=tuple(reserved_columns),
        tag_epochs=tag_epochs)


def build_dataset(data_config, feature_set, input_path: str, options: ReadOptions,
                  pin_memory: bool = False, sampler=None) -> FileDataset:
    """The dataset ``data_config.dataset_type`` names, over the files of ``input_path``
    (``pin_memory``: the loader pins its batches; ``sampler``: a NegativeSampler whose
    negatives follow each batch's rows)."""
    kind = _dataset_type(data_config)
    files = expand_input_path(input_path)
    if kind == "CsvDataset":
        return CsvDataset(files, feature_set, options, csv_format(data_config), pin_memory,
                          sampler)
    return ParquetDataset(files, feature_set, options, pin_memory, sampler)


def _dataset_type(data_config) -> str:
    kind = _enum_name(data_config, "dataset_type")
    if kind not in DATASET_TYPES:
        raise DataError(f"data_config.dataset_type {kind} is not supported; use one of "
                        f"{DATASET_TYPES}")
    return kind


def input_column_names(data_config, input_path: str) -> list[str]:
    """The columns the files of ``input_path`` hold, each once, in file order: their
    parquet schemas', or as ``data_config`` lays CSV out (header lines, or input_fields).
    The rows are not read.

    Raises:
        DataError: as :func:`build_dataset`, for a missing or unreadable file or an
            unsupported dataset type.
    """
    if _dataset_type(data_config) == "CsvDataset":
        source = CsvSource([], csv_format(data_config))
    else:
        source = ParquetSource([])
    names: dict[str, None] = {}
    for path in expand_input_path(input_path):
        names.update(dict.fromkeys(source.column_names(path)))
    return list(names)


def check_input(data_config, feature_set, input_path: str, mode: str,
                items=None) -> None:
    """What ``mode``'s loader of ``input_path`` checks when it is built (the files, their
    format and needed columns, an input without rows), without reading rows: for an
    input first read later, as the evaluation's after training. ``items``: as
    :func:`create_dataloader`'s.

    Raises:
        DataError: as :func:`create_dataloader`.
    """
    build_dataset(data_config, feature_set, input_path, read_options(data_config, mode),
                  sampler=negative_sampler(data_config, mode, items))


def create_dataloader(data_config, feature_set, input_path: str, mode: str, rank: int = 0,
                      world_size: int = 1, batch_size: int | None = None,
                      reserved_columns: Sequence[str] = (), num_epochs: int | None = 1,
                      seed: int = 0, num_workers: int | None = None,
                      start_method: str | None = None, tag_epochs: bool = False,
                      worker_cores: tuple[int, ...] | None = None,
                      items=None) -> BatchLoader:
    """An iterable of parsed :class:`Batch` objects for one rank.

    Args:
        data_config: DataConfig (batch_size, eval_batch_size, dataset_type,
            num_workers, pin_memory, shuffle, shuffle_buffer_size,
            drop_remainder, input_fields, delimiter, with_header).
        feature_set: FeatureSet that parses pyarrow tables into batches.
        input_path: comma-separated files, directories and glob patterns.
        mode: ``train`` (configured shuffle and drop_remainder, ``num_epochs``
            passes), ``eval`` (every row once, labels parsed; with workers, their
            batches interleaved) or ``predict`` (as eval, without labels,
            ``reserved_columns`` passed through).
        rank, world_size: this process's share of the rows.
        batch_size: overrides the configured (eval) batch size.
        reserved_columns: columns copied into ``Batch.reserved``.
        num_epochs: passes over the data per iteration (train only; None: without
            end, with ``tag_epochs``).
        seed: shuffle seed.
        tag_epochs: train only: yield ``(epoch, batch or None)`` pairs, epochs ``seed``,
            ``seed + 1``, ...; each reads as a one-pass loader with that seed (see
            ``ReadOptions.tag_epochs``; ``None`` items fill readers up to equal counts).
        num_workers: overrides ``data_config.num_workers``.
        start_method: how worker processes start (``fork``, ``forkserver``,
            ``spawn``); default ``forkserver`` once this process uses CUDA, else the
            platform's default. Forking a process that holds a CUDA context and a
            large heap blocks it for tens of milliseconds per worker, at every epoch;
            the fork server (hashrec's data modules preloaded) starts workers without
            stopping the training process. Scripts that build loaders then need the
            ``if __name__ == "__main__":`` guard, as with ``spawn``.
        worker_cores: CPU cores the workers run on (Linux; None: those of this
            process).
        items: the item table of ``data_config.negative_sampler`` (the tree of its
            ``tdm_sampler``), read already (``hashrec.data.sampler.negative_items``: a run
            reads it once for all its loaders); None reads it.

    Raises:
        DataError: unreadable or missing files, an input without rows, missing
            columns, unsupported types or dataset types. Errors raised while
            reading in a worker surface when iterating, as they were raised.
    """
    options = read_options(data_config, mode, rank, world_size, batch_size,
                           reserved_columns, num_epochs, seed, tag_epochs)
    workers = data_config.num_workers if num_workers is None else num_workers
    pin = bool(getattr(data_config, "pin_memory", False)) and torch.cuda.is_available()
    dataset = build_dataset(data_config, feature_set, input_path, options, pin,
                            negative_sampler(data_config, mode, items))
    context = _worker_context(start_method) if workers else None
    init = functools.partial(_init_worker, tuple(worker_cores) if worker_cores else None)
    return BatchLoader(dataset, batch_size=None, num_workers=int(workers), pin_memory=pin,
                       prefetch_factor=4 if workers else None, multiprocessing_context=context,
                       worker_init_fn=init, worker_cores=tuple(worker_cores) if worker_cores
                       else None)


class BatchLoader(DataLoader):
    """A DataLoader of a :class:`FileDataset`: a DataError raised reading in a worker
    is raised again by the iterator as it was raised (its type and message, rather
    than a new exception holding the worker's traceback; see ``WorkerFailure``).

    It takes its workers' items in turn (torch's in-order round robin, which skips a
    worker once it has ended): ``reader_turns`` and ``ReadOptions.tag_epochs`` rely
    on it.

    ``worker_cores``: the cores the workers run on, when not this process's; torch's
    check of the worker count then counts those rather than this process's own."""

    def __init__(self, *args, worker_cores: tuple[int, ...] | None = None, **kwargs) -> None:
        self.worker_cores = worker_cores
        super().__init__(*args, **kwargs)

    def check_worker_number_rationality(self) -> None:
        if self.worker_cores is None:
            super().check_worker_number_rationality()
        elif self.num_workers > len(self.worker_cores):
            warnings.warn(f"{self.num_workers} loader workers share {len(self.worker_cores)} "
                          f"cores; data_config.num_workers above the core count only adds "
                          f"contention", stacklevel=2)

    def __iter__(self) -> ReceivedItems:
        return ReceivedItems(super().__iter__())

    def reader_turns(self) -> Iterator[int]:
        """The reader (worker; 0 without workers) that each batch of one pass comes
        from, in the order this loader yields them."""
        dataset = self.dataset
        return reader_turns(dataset.reader_batches(dataset.options.rank, self.num_workers))


def reader_turns(counts: Sequence[int]) -> Iterator[int]:
    """The readers' indices in the order a loader yields their items, given each
    reader's item count: in turn, a reader left out once it has ended.

    Example::

        counts [2, 3, 1] -> 0, 1, 2, 0, 1, 1
    """
    for turn in range(max(counts, default=0)):
        yield from (reader for reader, count in enumerate(counts) if turn < count)


class ReceivedItems:
    """The items of a DataLoader iterator, raising the errors its workers send.

    Args:
        items: the DataLoader's iterator.
    """

    def __init__(self, items) -> None:
        self._items = items

    def __iter__(self) -> ReceivedItems:
        return self

    def __next__(self):
        item = next(self._items)
        if isinstance(item, WorkerFailure):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the workers now rather than when the iterator is collected."""
        shutdown = getattr(self._items, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _init_worker(cores: tuple[int, ...] | None, worker_id: int) -> None:
    """Loader ``worker_init_fn``: signals as below; the worker runs on ``cores`` (None:
    those of the training process)."""
    _worker_signals()
    if cores is not None:
        _run_on_cores(cores, worker_id)


def _worker_signals() -> None:
    """Ignore SIGINT, and end only on a second SIGTERM.

    A Ctrl-C reaches the whole process group, and torchrun or a batch scheduler send
    SIGTERM to it; a worker that ended then would fail the step the training process
    finishes before its checkpoint (``hashrec.train.interrupt``). The training process
    ends its workers itself (through their queues, or its own SIGTERM to a worker that
    does not stop, which is then its second).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def second_ends(signum: int, frame) -> None:
        del frame
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, second_ends)


def _run_on_cores(cores: tuple[int, ...], worker_id: int) -> None:
    """The worker runs on ``cores``."""
    del worker_id
    os.sched_setaffinity(0, cores)


_PRELOAD = ["hashrec.data.dataset", "hashrec.data.transfer", "hashrec.features"]


def _worker_context(start_method: str | None):
    """The multiprocessing context of loader workers (see ``create_dataloader``)."""
    if start_method is None:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        start_method = "forkserver"
    if start_method not in multiprocessing.get_all_start_methods():
        raise DataError(f"worker start method {start_method!r} is not available here; "
                        f"allowed: {', '.join(multiprocessing.get_all_start_methods())}")
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(_PRELOAD)  # used when the server first starts
    return context

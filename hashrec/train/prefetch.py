"""Copy the next batch to the GPU while the current one trains.

The data loader hands out batches in pinned host memory (``pin_memory``);
:class:`DevicePrefetcher` issues each batch's host-to-device copy on a side
CUDA stream one step ahead, so the copy overlaps the previous step's kernels
instead of sitting at the head of the next step. The training stream waits for
the copy before it uses the batch, and every tensor is recorded on the
training stream so the caching allocator does not hand its memory back to the
side stream while the step still reads it. On the CPU batches pass through.
:meth:`DevicePrefetcher.upcoming` shows the next batch early (a training step starts
its id deduplication ahead). :class:`EpochStream` hands out the training input
epoch by epoch from one loader that runs through all epochs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def _batch_tensors(batch) -> list[torch.Tensor]:
    """The batch's device tensors to record on the training stream (a packed batch's
    tensors are views of one buffer: recording it covers them all)."""
    if batch.packed is not None:
        return [batch.packed[0]]
    kjt = batch.sparse
    out = [kjt.values(), kjt.lengths(), kjt.offsets(), kjt.weights_or_none()]
    for group in (batch.dense, batch.sequence_dense, batch.labels):
        out.extend(group.values())
    return [t for t in out if t is not None]


class DevicePrefetcher:
    """Iterates ``batches`` on ``device``, each batch's copy started ``depth`` steps ahead.

    On CUDA the copy runs on a side stream; a batch is handed out (or shown by
    :meth:`upcoming`) only after the current stream was told to wait for its
    copy. On the CPU batches pass through, still ahead so that :meth:`upcoming`
    works the same.
    """

    def __init__(self, batches: Iterable, device: torch.device, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._batches = batches
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self._side = torch.cuda.Stream(self._device) if self._cuda else None
        self._depth = depth
        self._next: list[list] = []  # [batch, ready on the current stream], oldest first

    def _start(self, batch) -> list | None:
        if batch is None:
            return None
        if not self._cuda:
            return [batch.to(self._device), True]
        with torch.cuda.stream(self._side):
            return [batch.to(self._device, non_blocking=True), False]

    def _ready(self, entry: list):
        if not entry[1]:
            main = torch.cuda.current_stream(self._device)
            main.wait_stream(self._side)
            for tensor in _batch_tensors(entry[0]):
                tensor.record_stream(main)
            entry[1] = True
        return entry[0]

    def __iter__(self) -> Iterator:
        iterator = iter(self._batches)
        self._next = []
        self._fill(iterator)
        while self._next:
            current = self._ready(self._next.pop(0))
            self._fill(iterator)
            yield current

    def _fill(self, iterator) -> None:
        """Starts copies until ``depth`` batches are in flight (or the input ends)."""
        while len(self._next) < self._depth:
            entry = self._start(next(iterator, None))
            if entry is None:
                return
            self._next.append(entry)

    def upcoming(self, ahead: int = 1):
        """The ``ahead``-th batch after the one last handed out (1: the next), usable on
        the current stream from here on (its copy may still be running), or None past
        the end. ``ahead`` is at most the prefetch depth."""
        if not 1 <= ahead <= self._depth:
            raise ValueError(f"upcoming({ahead}): this prefetcher sees 1 to {self._depth} "
                             f"batches ahead")
        return self._ready(self._next[ahead - 1]) if ahead <= len(self._next) else None


class EpochStream:
    """The training input epoch by epoch, read by one loader that runs through them all.

    Restarting the loader at every epoch costs the training process each time: its
    workers start and fill their queues in a burst while the step runs (about a tenth
    of the throughput, measured on the GPU host). Here one loader made with
    ``tag_epochs`` (``hashrec.data.create_dataloader``) yields ``(epoch, batch or
    None)`` items, a fixed number per epoch, and its workers go from one epoch to the
    next without stopping. ``epoch(e)`` hands out epoch ``e``'s batches, at most
    ``steps`` of them (the ranks' common count: no per-step agreement is needed), and
    drops the fillers and any batch beyond that count. Epoch ``e`` reads the same
    batches as a one-epoch loader seeded ``e``.

    A rank with more batches than ``steps`` leaves out its partial batch (the input's
    last rows, fewer than a batch) before any full one: the rows a rank does not train in
    an epoch are then at most a batch, the partial one first.

    Args:
        make: ``(first_epoch, num_epochs or None) -> (loader, items, steps[, own,
            batch_size])``: the loader from ``first_epoch`` on, its items per epoch, the
            batches per epoch every rank trains on, and this rank's batches per epoch and
            full batch's rows (without them, no batch is told apart as partial).
    """

    def __init__(self, make) -> None:
        self._make = make
        self._iterator: Iterator | None = None
        self._items = self._steps = self._spare = self._batch_size = 0
        self._next_epoch: int | None = None  # the epoch the stream is at, between epochs

    @property
    def steps(self) -> int:
        """Batches per epoch handed out (after the first ``epoch`` call)."""
        return self._steps

    def epoch(self, epoch: int, last: int | None = None, skip: int = 0) -> Iterator:
        """Batches of ``epoch``; ``last``: the epoch after the final one (None: no end);
        ``skip``: leave out the epoch's first batches (those a resumed run trained
        before; they are still read, the order of the rest depends on them).

        Reuses the running loader when it stands at ``epoch``; otherwise (the first
        call, a jump, an epoch left unfinished) starts a new one."""
        if self._iterator is None or self._next_epoch != epoch:
            self.close()
            loader, self._items, self._steps, *own = self._make(
                epoch, None if last is None else max(last - epoch, 1))
            self._spare = max(own[0] - self._steps, 0) if own else 0
            self._batch_size = own[1] if len(own) > 1 else 0
            self._iterator = iter(loader)
        self._next_epoch = None
        return self._take(epoch, skip)

    def _take(self, epoch: int, skip: int) -> Iterator:
        handed, spare = 0, self._spare
        for _ in range(self._items):
            tag, batch = next(self._iterator)
            if tag != epoch:
                raise RuntimeError(f"the training input gave a batch of epoch {tag} while "
                                   f"epoch {epoch} was read; the loader's readers are out of "
                                   f"step")
            if batch is not None and spare and batch.batch_size < self._batch_size:
                spare -= 1  # the partial batch gives way to a full one
                continue
            if batch is not None and handed < self._steps:
                handed += 1
                if handed > skip:
                    yield batch
        self._next_epoch = epoch + 1

    def close(self) -> None:
        """Stops the loader (its workers shut down)."""
        iterator, self._iterator, self._next_epoch = self._iterator, None, None
        close = getattr(iterator, "close", None)  # hashrec.data's loaders have one
        if close is not None:
            close()

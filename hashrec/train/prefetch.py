"""Copy the next batch to the GPU while the current one trains.

The data loader hands out batches in pinned host memory (``pin_memory``);
:func:`prefetch_to_device` issues each batch's host-to-device copy on a side
CUDA stream one step ahead, so the copy overlaps the previous step's kernels
instead of sitting at the head of the next step. The training stream waits for
the copy before it uses the batch, and every tensor is recorded on the
training stream so the caching allocator does not hand its memory back to the
side stream while the step still reads it. On the CPU batches pass through.

With ``prepare`` (the trainer passes the embedding collection's id dedup,
``EmbeddingCollection.prepare``), a background thread takes batches from the
loader, copies them and runs ``prepare`` on the side stream, one batch ahead: the
dedup's kernels, its host read of the sizes and its Python work then overlap the
current step's backward (during which the training thread waits; the caller
reports the end of each forward with ``Prefetched.forward_done``) instead of
opening the next step. Errors in the thread are raised in the caller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Producer(threading.Thread):
    """Loader -> device copy -> ``prepare``, on a side stream, into a one-slot queue."""

    def __init__(self, batches: Iterable, device: torch.device, prepare: Callable) -> None:
        super().__init__(name="hashrec-prefetch", daemon=True)
        self.batches, self.device, self.prepare = batches, device, prepare
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.stopped = threading.Event()
        # One permit per step: the next batch is prepared once the current step's forward
        # is done (its Python work would otherwise compete with the forward's).
        self.permits = threading.Semaphore(1)

    def run(self) -> None:
        try:
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
            side = torch.cuda.Stream(self.device)
            for batch in self.batches:
                with torch.cuda.stream(side):
                    batch = batch.to(self.device, non_blocking=True)
                if not self._wait_for_permit():
                    return
                with torch.cuda.stream(side):
                    self.prepare(batch)
                    ready = torch.cuda.Event()
                    ready.record(side)
                if not self._put((batch, ready)):
                    return
            self._put(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            self._put(_Failure(err))

    def _wait_for_permit(self) -> bool:
        while not self.permits.acquire(timeout=0.1):
            if self.stopped.is_set():
                return False
        return not self.stopped.is_set()

    def _put(self, item) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


class Prefetched:
    """Batches on the device (iterate once); see :func:`prefetch_to_device`."""

    def __init__(self, batches: Iterable, device: torch.device,
                 prepare: Callable | None) -> None:
        self._producer = None
        if device.type == "cuda" and prepare is not None:
            self._producer = _Producer(batches, device, prepare)
            self._iterator = self._from_producer(device)
        else:
            self._iterator = _copied_ahead(batches, device)

    def __iter__(self) -> Iterator:
        return self._iterator

    def __next__(self):
        return next(self._iterator)

    def close(self) -> None:
        """Stops early: the background thread ends and drops the loader."""
        self._iterator.close()

    def forward_done(self) -> None:
        """The current batch's forward has finished: the next batch may be prepared."""
        if self._producer is not None:
            self._producer.permits.release()

    def _from_producer(self, device: torch.device) -> Iterator:
        producer = self._producer
        producer.start()
        try:
            while True:
                item = producer.queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                batch, ready = item
                main = torch.cuda.current_stream(device)
                main.wait_event(ready)
                for tensor in _batch_tensors(batch):
                    tensor.record_stream(main)
                yield batch
        finally:
            producer.stopped.set()
            producer.join(timeout=10.0)


def _batch_tensors(batch) -> list[torch.Tensor]:
    out = batch.sparse.tensors()
    for group in (batch.dense, batch.sequence_dense, batch.labels):
        out.extend(group.values())
    return [t for t in out if t is not None]


def prefetch_to_device(batches: Iterable, device: torch.device,
                       prepare: Callable | None = None) -> Prefetched:
    """``batches`` on ``device``; on CUDA the next batch is copied one step ahead (and,
    with ``prepare``, ``prepare(batch)`` runs on it in a background thread once the
    caller reports the current forward done: ``Prefetched.forward_done``)."""
    return Prefetched(batches, torch.device(device), prepare)


def _copied_ahead(batches: Iterable, device: torch.device) -> Iterator:
    if device.type != "cuda":
        for batch in batches:
            yield batch.to(device)
        return
    side = torch.cuda.Stream(device)
    iterator = iter(batches)

    def start(batch):
        if batch is None:
            return None
        with torch.cuda.stream(side):
            return batch.to(device, non_blocking=True)

    pending = start(next(iterator, None))
    while pending is not None:
        main = torch.cuda.current_stream(device)
        main.wait_stream(side)
        for tensor in _batch_tensors(pending):
            tensor.record_stream(main)
        current = pending
        pending = start(next(iterator, None))
        yield current


class EpochInputs:
    """The training input epoch by epoch, the next epoch's loader started one epoch ahead.

    A data loader with worker processes needs a second or so to start its workers
    and fill their queues; at every epoch boundary the step would wait for it.
    ``epoch(e, more)`` returns epoch ``e``'s batches and, when ``more`` epochs may
    follow, starts epoch ``e + 1``'s loader right away: its workers fill their
    queues (then block) while epoch ``e`` trains. The batches of every epoch are
    the same as without the head start; an epoch started but never used is shut
    down by ``close``.

    Args:
        make: epoch -> iterable of batches (a fresh loader for that epoch).
        ahead: start the next epoch early (worth it only with loader workers).
    """

    def __init__(self, make, ahead: bool) -> None:
        self._make, self._ahead = make, ahead
        self._next: tuple[int, Iterator] | None = None

    def epoch(self, epoch: int, more: bool) -> Iterator:
        """Batches of ``epoch``; starts ``epoch + 1`` when ``more`` and running ahead."""
        if self._next is not None and self._next[0] == epoch:
            current = self._next[1]
        else:
            current = iter(self._make(epoch))
        self._next = None
        if self._ahead and more:
            self._next = (epoch + 1, iter(self._make(epoch + 1)))
        return current

    def close(self) -> None:
        """Drops an epoch started ahead and not used (its workers shut down)."""
        self._next = None

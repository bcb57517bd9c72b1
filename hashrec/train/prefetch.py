"""Copy the next batch to the GPU while the current one trains.

The data loader hands out batches in pinned host memory (``pin_memory``);
:class:`DevicePrefetcher` issues each batch's host-to-device copy on a side
CUDA stream one step ahead, so the copy overlaps the previous step's kernels
instead of sitting at the head of the next step. The training stream waits for
the copy before it uses the batch, and every tensor is recorded on the
training stream so the caching allocator does not hand its memory back to the
side stream while the step still reads it. On the CPU batches pass through.
:meth:`DevicePrefetcher.upcoming` shows the next batch early (a training step starts
its id deduplication ahead).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import torch


def _batch_tensors(batch) -> list[torch.Tensor]:
    kjt = batch.sparse
    out = [kjt.values(), kjt.lengths(), kjt.offsets(), kjt.weights_or_none()]
    for group in (batch.dense, batch.sequence_dense, batch.labels):
        out.extend(group.values())
    return [t for t in out if t is not None]


class DevicePrefetcher:
    """Iterates ``batches`` on ``device``, each batch's copy started one step ahead.

    On CUDA the copy runs on a side stream; a batch is handed out (or shown by
    :meth:`upcoming`) only after the current stream was told to wait for its
    copy. On the CPU batches pass through, still one ahead so that
    :meth:`upcoming` works the same.
    """

    def __init__(self, batches: Iterable, device: torch.device) -> None:
        self._batches = batches
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self._side = torch.cuda.Stream(self._device) if self._cuda else None
        self._next: list | None = None  # [batch, ready on the current stream]

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
        self._next = self._start(next(iterator, None))
        while self._next is not None:
            current = self._ready(self._next)
            self._next = self._start(next(iterator, None))
            yield current

    def upcoming(self):
        """The batch after the one last handed out, usable on the current stream from
        here on (its copy may still be running), or None at the end."""
        return None if self._next is None else self._ready(self._next)


class _Started:
    """``iter(loader)`` run on a background thread (starting loader workers takes the
    caller tens of milliseconds per worker; the training thread should not wait)."""

    def __init__(self, make, epoch: int) -> None:
        self.epoch = epoch
        self._iterator: Iterator | None = None
        self._error: BaseException | None = None
        # The CUDA device is per thread, and a loader pins batches for the device that
        # is current where it starts: the caller's (a rank's own GPU), not device 0.
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        self._thread = threading.Thread(target=self._run, args=(make, device),
                                         name=f"hashrec-epoch-{epoch}-start", daemon=True)
        self._thread.start()

    def _run(self, make, device: int | None) -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            self._iterator = iter(make(self.epoch))
        except BaseException as err:  # re-raised in the training thread by result()
            self._error = err

    def result(self) -> Iterator:
        """The started iterator (waits for the start); the start's exception if it failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._iterator


class EpochInputs:
    """The training input epoch by epoch, the next epoch's loader started one epoch ahead.

    A data loader with worker processes needs a second or so to start its workers
    and fill their queues; at every epoch boundary the step would wait for it.
    ``epoch(e, more)`` returns epoch ``e``'s batches and, when ``more`` epochs may
    follow, starts epoch ``e + 1``'s loader right away, on a background thread (the
    worker start itself would stall the training thread): its workers fill their
    queues (then block) while epoch ``e`` trains. The batches of every epoch are
    the same as without the head start; an epoch started but never used is shut
    down by ``close``.

    Args:
        make: epoch -> iterable of batches (a fresh loader for that epoch).
        ahead: start the next epoch early (worth it only with loader workers).
    """

    def __init__(self, make, ahead: bool) -> None:
        self._make, self._ahead = make, ahead
        self._next: _Started | None = None

    def epoch(self, epoch: int, more: bool) -> Iterator:
        """Batches of ``epoch``; starts ``epoch + 1`` when ``more`` and running ahead."""
        started, self._next = self._next, None
        if started is not None and started.epoch == epoch:
            current = started.result()
        else:
            if started is not None:
                started.result()  # let an unused start finish before dropping it
            current = iter(self._make(epoch))
        if self._ahead and more:
            self._next = _Started(self._make, epoch + 1)
        return current

    def close(self) -> None:
        """Drops an epoch started ahead and not used (its workers shut down)."""
        started, self._next = self._next, None
        if started is not None:
            try:
                started.result()
            except Exception:  # noqa: BLE001 - an epoch never used; its error does not matter
                pass

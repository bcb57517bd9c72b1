"""Copy the next batch to the GPU while the current one trains.

The data loader hands out batches in pinned host memory (``pin_memory``);
:func:`prefetch_to_device` issues each batch's host-to-device copy on a side
CUDA stream one step ahead, so the copy overlaps the previous step's kernels
instead of sitting at the head of the next step. The training stream waits for
the copy before it uses the batch, and every tensor is recorded on the
training stream so the caching allocator does not hand its memory back to the
side stream while the step still reads it. On the CPU batches pass through.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def _batch_tensors(batch) -> list[torch.Tensor]:
    kjt = batch.sparse
    out = [kjt.values(), kjt.lengths(), kjt.offsets(), kjt.weights_or_none()]
    for group in (batch.dense, batch.sequence_dense, batch.labels):
        out.extend(group.values())
    return [t for t in out if t is not None]


def prefetch_to_device(batches: Iterable, device: torch.device) -> Iterator:
    """Yield ``batches`` on ``device``; on CUDA the next batch is copied one step ahead."""
    device = torch.device(device)
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

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

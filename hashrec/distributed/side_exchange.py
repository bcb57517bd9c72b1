"""Small collectives run beside the training stream, and the ordering they need.

The ranks share each prepared batch's dedup sizes with an all-gather
(``hashrec.embedding.batching.PendingDedup``). On the training stream that
all-gather stalls the device until the slowest rank reaches it: 0.15-0.47 ms per
step on 2 H200s (``benchmarks/results/collective_skew_gpu_x2_dynamicemb.md``),
although nothing on the stream needs its result before the next step's forward.
:func:`run_aside` runs such a collective on a side stream instead, after the work
queued so far, so the training stream goes on with the step.

One rule comes with it. Eager collectives of a process group are queued on that
group's own NCCL stream, so they stay in issue order with a side collective. The
captured exchanges of ``hashrec.distributed.sharded_graphs`` are not: a graph's
NCCL kernels run on the stream that replays it, and two collectives of one
communicator must never run at the same time. So a replay first orders its stream
after the latest side collective (:func:`order_after_side`), and a capture waits
for it on the host (:func:`settle_side`). On CPU (gloo) nothing runs aside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

_lock = threading.Lock()
_streams: dict[int, torch.cuda.Stream] = {}
_latest: dict[int, torch.cuda.Event] = {}  # device index -> the latest side collective


def _index(device: torch.device | str) -> int:
    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


def _side_stream(index: int) -> torch.cuda.Stream:
    with _lock:
        stream = _streams.get(index)
        if stream is None:
            stream = _streams[index] = torch.cuda.Stream(index)
        return stream


def run_aside(device: torch.device | str, run: Callable[[], torch.Tensor],
              inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.cuda.Event]:
    """Runs ``run()`` (queues a collective and whatever follows it, e.g. a copy to the
    host) on ``device``'s side stream after the work queued so far on the current
    stream; returns its result and an event recorded after it. ``inputs``, made on the
    current stream, are kept from reuse until the side stream is done with them."""
    index = _index(device)
    main = torch.cuda.current_stream(index)
    side = _side_stream(index)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out = run()
        event = torch.cuda.Event()
        event.record(side)
    for tensor in inputs:
        tensor.record_stream(side)
    with _lock:
        _latest[index] = event
    return out, event


def order_after_side(device: torch.device | str) -> None:
    """Makes the current stream wait for the latest side collective of ``device``
    (before replaying a graph that holds collectives)."""
    index = _index(device)
    event = _latest.get(index)
    if event is not None:
        torch.cuda.current_stream(index).wait_event(event)


def settle_side(device: torch.device | str) -> None:
    """Waits on the host for the latest side collective of ``device`` (before a capture)."""
    event = _latest.get(_index(device))
    if event is not None:
        event.synchronize()

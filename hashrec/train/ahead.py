"""The next batch's id deduplication on a helper thread, while the step's dense work runs.

A training step on one GPU is bound by the host: it issues every kernel from
Python, one thread. Part of that work does not depend on the step at all: the
next batch's deduplication (``EmbeddingCollection.prepare``), a few dozen
operators per storage. ``AheadPrepare`` runs it on a helper thread from the end
of the step's embedding forward to the end of its optimizer step, while the
training thread replays the dense network and runs the backward. PyTorch
releases the GIL inside each operator, so the two threads' launches interleave
and the step's host time shrinks by the part of the deduplication that
overlaps.

On a GPU the helper queues its kernels on a stream of its own, which first waits
for the training stream's work queued so far (the batch's copy among it): its
sorts then run beside the step's kernels instead of behind them, and the sizes
they send to the host are there when the next step needs them, so the host keeps
its lead on the device. The collection records the prepared batch's tensors on
the training stream when it uses them (``record_stream``), so memory is never
handed back to the helper's stream while the step still reads it. The
deduplication reads nothing the step writes; results do not depend on how the
two threads' launches interleave. The helper's work is waited for before the
step returns and before a CUDA graph is captured.

On by default on a GPU with one process (``HASHREC_PREPARE_THREAD=0`` turns it
off, ``=1`` turns it on on the CPU too); off under several ranks, where the
deduplication exchanges sizes in a collective that must keep its place among
the step's.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import Future, ThreadPoolExecutor

import torch

ENV = "HASHREC_PREPARE_THREAD"


def prepare_thread_wanted(device: torch.device, world_size: int) -> bool:
    """Whether the next batch's deduplication runs on a helper thread (see the module
    docstring).

    Raises:
        ValueError: ``HASHREC_PREPARE_THREAD`` is set to neither 0 nor 1.
    """
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: expected 0 or 1")
    if world_size > 1 or value == "0":
        return False
    return value == "1" or device.type == "cuda"


class AheadPrepare:
    """Runs one call at a time on a helper thread, or inline when not ``threaded``.

    Args:
        threaded: False runs every ``start``ed call at once, on the caller's thread.
        device: the training device (the helper thread makes it its current CUDA
            device).
    """

    def __init__(self, threaded: bool, device: torch.device) -> None:
        self._pool = None
        self._pending: Future | None = None
        self._stream = None
        if threaded:
            initializer = None
            if device.type == "cuda":
                index = torch.cuda.current_device() if device.index is None else device.index
                initializer = functools.partial(torch.cuda.set_device, index)
                self._stream = torch.cuda.Stream(index)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="hashrec-prepare",
                                            initializer=initializer)

    @property
    def threaded(self) -> bool:
        return self._pool is not None

    def start(self, fn, *args) -> None:
        """Starts ``fn(*args)`` after waiting for the previous call."""
        self.wait()
        if self._pool is None:
            fn(*args)
            return
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))
        self._pending = self._pool.submit(self._run, fn, args)

    def _run(self, fn, args) -> None:
        if self._stream is None:
            fn(*args)
            return
        with torch.cuda.stream(self._stream):
            fn(*args)

    def wait(self) -> None:
        """Waits for the running call; raises what it raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Waits for the running call and stops the helper thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

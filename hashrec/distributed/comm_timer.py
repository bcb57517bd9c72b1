"""Time spent in collective exchanges, measured without stalling the step.

On CUDA each timed region records a pair of CUDA events on the current stream
(NCCL work joins that stream before the region ends, so the pair spans the
exchange); the elapsed times are read only when :meth:`CommTimer.drain` is
called, typically once per logging window, and the pairs read are reused (creating
events costs the host more than recording them). On CPU (gloo) the collectives are
synchronous and the host clock measures them directly.
"""

from __future__ import annotations

import contextlib
import time

import torch

# Pending event pairs are read (one sync) once this many accumulate without a drain.
_MAX_PENDING = 4096


class CommTimer:
    """Accumulates the duration of timed regions (all-to-all, gradient syncs).

    Args:
        device: device the collectives run on (CUDA events on ``cuda``).
        enabled: False makes :meth:`region` a no-op (world size 1).
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.device = torch.device(device)
        self.enabled = enabled
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._spare: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # read, reusable
        self._seconds = 0.0
        self._regions = 0

    @contextlib.contextmanager
    def region(self):
        """Context that adds its duration to the running total."""
        if not self.enabled or _capturing(self.device):
            yield  # a captured exchange is not timed: its events could not be read
            return
        self._regions += 1
        if self.device.type == "cuda":
            start, end = self._spare.pop() if self._spare else (
                torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((start, end))
                if len(self._events) >= _MAX_PENDING:
                    self._fold_events()
            return
        begin = time.perf_counter()
        try:
            yield
        finally:
            self._seconds += time.perf_counter() - begin

    def drain(self) -> tuple[float, int]:
        """(seconds, regions) timed since the last drain; resets the totals.

        On CUDA this waits for the recorded events (call it when logging, not per step).
        """
        self._fold_events()
        seconds, regions = self._seconds, self._regions
        self._seconds, self._regions = 0.0, 0
        return seconds, regions

    def _fold_events(self) -> None:
        """Read the pending CUDA events into the running total (waits for the last one)."""
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(s.elapsed_time(e) for s, e in self._events) / 1000.0
            self._spare += self._events
            self._events = []


def _capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()

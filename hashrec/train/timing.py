"""Per-phase step times of a training run, measured without stalling the step.

A ``StepTimer`` splits every training step into named phases by marks placed
at phase boundaries; a phase lasts from the previous mark to its own. The
phases of one step, in order:

* ``data_wait``: from the end of the previous step until the batch is on the
  device (waiting for the data loader plus the host-to-device copy);
* ``embedding_forward``: lookups of every storage, including id
  deduplication and, under several ranks, the all-to-all exchanges;
* ``dense_forward``: the dense network, the loss;
* ``backward``: the whole autograd backward; the summary splits it into
  ``embedding_backward`` (the storages' backward nodes: gradient exchange and
  the fused sparse optimizer, timed inside ``hashrec.embedding.lookup`` through
  the collection's ``backward_timer``) and ``dense_backward`` (the rest, which
  also holds the pooling ops' backward);
* ``optimizer``: dense-gradient all-reduce, unscaling, clipping, dense step;
* ``logging``: progress line, summaries (mostly zero outside logging steps).

After warm-up, every :meth:`StepTimer.drain` (the progress line's window) also
closes a window whose global samples/s on the host clock and phases the summary
lists (``windows``): the average alone hides whether a run is slow throughout or
stalls now and then. Under several ranks the training loop adds every rank's
summary (``ranks``) to rank 0's file: a rank's phases that hold collectives include
its waits for the others, so the slow rank is the one that waits least.

On CUDA every mark records a CUDA event on the current stream, so a phase is
its length on the device's timeline (a phase the host runs ahead of costs what
the device spends on it; host waits show up as device idle time in the phase
where they happen). Events are read only in :meth:`StepTimer.drain` and
:meth:`StepTimer.summary`, i.e. at logging time. On the CPU marks read
``time.perf_counter``. The host's own wait for the data loader is also kept
(``data_wait_host``): it tells whether the host, not the device, waited.

The summary also says how much of the host the training threads got over the
measured steps (``host_threads``: the main thread's CPU share of the wall clock,
and the training threads' preemptions per step; ``hashrec.train.host_threads``).

``HASHREC_STEP_TIMING=host`` reads the host clock on CUDA too: each phase is
then the time the training thread spent issuing it, which on a host-bound step
shows where the host's time goes (the device timeline shows where the device
waited).

Timing is off unless enabled (``HASHREC_STEP_TIMING=1`` or ``host`` in the
environment, or a timer passed to the loop); a disabled timer's methods return at
once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import torch

from hashrec.train import host_threads

ENV_FLAG = "HASHREC_STEP_TIMING"
ENV_WARMUP = "HASHREC_STEP_TIMING_WARMUP"
TIMING_FILE = "step_timing.json"
PHASES = ("data_wait", "embedding_forward", "dense_forward", "backward", "optimizer",
          "logging")
# Pending CUDA events are read (one sync) once this many steps accumulate undrained.
_MAX_PENDING_STEPS = 2048


class StepTimer:
    """Accumulates phase durations of training steps (see the module docstring).

    Args:
        device: the training device (CUDA events on ``cuda``, else the host clock).
        enabled: False makes every method a no-op.
        warmup_steps: steps left out of :meth:`summary` (compilation, table growth,
            allocator warm-up); the log windows of :meth:`drain` count every step.
        world_size: ranks training in lockstep (global samples in the summary).
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = False,
                 warmup_steps: int = 0, world_size: int = 1, host_clock: bool = False
                 ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps}; allowed: >= 0")
        self.device = torch.device(device)
        self.enabled = enabled
        self.warmup_steps = warmup_steps
        self.world_size = world_size
        self._cuda = self.device.type == "cuda" and not host_clock
        self._steps = 0
        self._last = None            # the previous mark (event or host time)
        self._pending: list[list] = []   # per step: [(phase, start, end), ...]
        self._current: list = []
        self._wait_started = 0.0
        self._window = self._empty()
        self._total = self._empty()
        self._measured_samples = 0
        self._measured_start: float | None = None
        # Windows between drains after warm-up: [steps, samples, seconds, phases] each.
        self._windows: list[list] = []
        self._window_samples = 0
        self._window_start: float | None = None
        self._threads_start: host_threads.ThreadSample | None = None  # at warm-up's end

    @classmethod
    def from_env(cls, device, world_size: int = 1) -> StepTimer:
        """A timer enabled by ``HASHREC_STEP_TIMING=1`` (``host``: on the host clock;
        warm-up from ``..._WARMUP``)."""
        value = os.environ.get(ENV_FLAG, "0").strip().lower()
        host = value == "host"
        enabled = host or value in ("1", "true", "yes", "on")
        warmup = int(os.environ.get(ENV_WARMUP, "0") or 0)
        return cls(device, enabled, warmup, world_size, host_clock=host)

    @staticmethod
    def _empty() -> dict[str, float]:
        return {name: 0.0 for name in (*PHASES, "embedding_backward", "data_wait_host",
                                       "steps")}

    def _now(self):
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self) -> None:
        """Start the clock before the first batch is requested."""
        if self.enabled:
            self._last = self._now()
            self._wait_started = time.perf_counter()
            if self.warmup_steps == 0 and self._measured_start is None:
                self._measured_start = self._window_start = self._wait_started
                self._threads_start = host_threads.sample()

    def batch_ready(self) -> None:
        """The host got the next batch (ends the host-side data wait)."""
        if self.enabled:
            self._current.append(("data_wait_host", time.perf_counter() - self._wait_started,
                                  None))

    def mark(self, phase: str) -> None:
        """End ``phase`` of the current step now."""
        if not self.enabled:
            return
        if self._last is None:
            self.begin()
        now = self._now()
        self._current.append((phase, self._last, now))
        self._last = now

    @contextlib.contextmanager
    def region(self, phase: str):
        """Context timing a sub-phase inside another (``embedding_backward``)."""
        if not self.enabled:
            yield
            return
        start = self._now()
        try:
            yield
        finally:
            self._current.append((phase, start, self._now()))

    def sub_timer(self, phase: str) -> _SubTimer:
        """An object whose ``region()`` times ``phase`` (the collection's ``backward_timer``)."""
        return _SubTimer(self, phase)

    def end_step(self, batch_size: int) -> None:
        """Close the current step (``batch_size`` rows on this rank)."""
        if not self.enabled:
            return
        self._steps += 1
        self._current.append(("samples", batch_size, None))
        self._pending.append(self._current)
        self._current = []
        self._wait_started = time.perf_counter()
        if self._steps == self.warmup_steps:
            self._fold()
            self._measured_start = time.perf_counter()
            self._threads_start = host_threads.sample()
            self._total = self._empty()
            self._measured_samples = 0
            self._window = self._empty()
            self._window_samples = 0
            self._window_start = self._measured_start
        elif len(self._pending) >= _MAX_PENDING_STEPS:
            self._fold()

    def _fold(self) -> None:
        """Read the pending steps' marks into the window and total sums."""
        if not self._pending:
            return
        if self._cuda:
            self._last.synchronize()
        for step in self._pending:
            for phase, start, end in step:
                if phase == "samples":
                    self._measured_samples += start
                    self._window_samples += start
                    continue
                seconds = start if end is None else self._elapsed(start, end)
                self._window[phase] += seconds
                self._total[phase] += seconds
            self._window["steps"] += 1
            self._total["steps"] += 1
        self._pending = []

    def _elapsed(self, start, end) -> float:
        if self._cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start

    def drain(self) -> dict[str, float]:
        """Milliseconds per step of each phase since the last drain (waits for the device)."""
        if not self.enabled:
            return {}
        self._fold()
        window, self._window = self._window, self._empty()
        now = time.perf_counter()
        phases = _per_step_ms(window)
        if self._window_start is not None and window["steps"]:
            self._windows.append([int(window["steps"]), self._window_samples,
                                  now - self._window_start, phases])
        self._window_samples, self._window_start = 0, (
            now if self._measured_start is not None else None)
        return phases

    def summary(self) -> dict:
        """Steps after warm-up: samples/s (wall clock) and milliseconds per step per phase."""
        if not self.enabled:
            return {}
        self._fold()
        if self.device.type == "cuda":  # the wall clock covers the device's work too
            torch.cuda.synchronize(self.device)
        measured = self._measured_start is not None
        steps = int(self._total["steps"]) if measured else 0
        seconds = time.perf_counter() - self._measured_start if measured else 0.0
        out = {"steps": steps, "warmup_steps": self.warmup_steps,
               "samples": self._measured_samples if measured else 0, "seconds": seconds,
               "world_size": self.world_size,
               "phases_ms": _per_step_ms(self._total) if steps else {}}
        if not measured:
            out["note"] = "fewer steps than warmup_steps: nothing measured"
        if seconds > 0:
            out["samples_per_second"] = self._measured_samples / seconds
            out["global_samples_per_second"] = out["samples_per_second"] * self.world_size
        if self._windows:
            out["windows"] = [{"steps": steps, "global_samples_per_second":
                               samples * self.world_size / max(secs, 1e-9),
                               "phases_ms": phases}
                              for steps, samples, secs, phases in self._windows]
        if measured and self._threads_start is not None:
            out["host_threads"] = host_threads.usage(self._threads_start, host_threads.sample(),
                                                     seconds, steps)
        return out

    def write(self, model_dir: str, rank: int = 0, extra: dict | None = None,
              summary: dict | None = None) -> str | None:
        """Write ``summary`` (default :meth:`summary`) plus ``extra`` to
        ``<model_dir>/step_timing.json`` (rank 0)."""
        if not self.enabled or rank != 0:
            return None
        os.makedirs(model_dir, exist_ok=True)
        path = os.path.join(model_dir, TIMING_FILE)
        summary = self.summary() if summary is None else summary
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**summary, **(extra or {})}, f, indent=2, sort_keys=True)
        return path


class _SubTimer:
    """``region()`` of one named sub-phase of a StepTimer."""

    def __init__(self, timer: StepTimer, phase: str) -> None:
        self.timer, self.phase = timer, phase

    def region(self):
        return self.timer.region(self.phase)


def _per_step_ms(sums: dict[str, float]) -> dict[str, float]:
    steps = sums["steps"]
    if not steps:
        return {}
    out = {name: 1000.0 * value / steps for name, value in sums.items() if name != "steps"}
    out["dense_backward"] = max(out["backward"] - out["embedding_backward"], 0.0)
    out["step"] = sum(out[name] for name in PHASES)
    return out


def format_phases(phases_ms: dict[str, float]) -> str:
    """``data 0.4 emb_fwd 3.1 ... ms/step`` for the progress line."""
    short = {"data_wait": "data", "embedding_forward": "emb_fwd", "dense_forward": "dense_fwd",
             "dense_backward": "dense_bwd", "embedding_backward": "emb_bwd",
             "optimizer": "opt", "logging": "log", "step": "step"}
    return " ".join(f"{label} {phases_ms[name]:.2f}" for name, label in short.items()
                    if name in phases_ms) + " ms/step"

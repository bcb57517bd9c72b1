"""How much of the host the training threads got: their CPU time and preemptions.

A training step on a GPU is bound by the host threads that issue its work: the main
thread (data, forward, optimizer) and autograd's device thread (``pt_autograd_N``,
the backward). When loader workers or other ranks' threads are runnable on the
same cores, the kernel preempts those threads and the step waits; two runs of the
same code on one host can then differ by a fifth. The step timer records, for the
measured steps, the main thread's CPU time as a share of the wall clock and the
involuntary context switches of the training threads per step, so that a slow run
shows whether its threads were crowded out.

Preemption counts come from ``/proc`` (Linux); elsewhere they are absent.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

_TASKS = "/proc/self/task"
_AUTOGRAD_PREFIX = "pt_autograd"


@dataclass(frozen=True)
class ThreadSample:
    """The main thread's CPU seconds and the training threads' involuntary context
    switches (None without ``/proc``) at one moment."""

    main_cpu_seconds: float
    preemptions: int | None


def sample() -> ThreadSample:
    """A sample taken now (call it on the main thread: its CPU time is the caller's)."""
    return ThreadSample(time.thread_time(), _preemptions())


def usage(start: ThreadSample, end: ThreadSample, wall_seconds: float, steps: int) -> dict:
    """``main_thread_cpu_share`` (CPU seconds / wall seconds) and, where counted,
    ``preemptions_per_step`` between two samples over ``steps`` steps."""
    out = {}
    if wall_seconds > 0:
        out["main_thread_cpu_share"] = (end.main_cpu_seconds - start.main_cpu_seconds) \
            / wall_seconds
    if steps > 0 and start.preemptions is not None and end.preemptions is not None:
        out["preemptions_per_step"] = (end.preemptions - start.preemptions) / steps
    return out


def _preemptions() -> int | None:
    """Involuntary context switches of the main thread and autograd's threads so far."""
    if not os.path.isdir(_TASKS):
        return None
    main = threading.main_thread().native_id
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in tids:
        if int(tid) != main and not _name(tid).startswith(_AUTOGRAD_PREFIX):
            continue
        count = _involuntary(tid)
        if count is None and int(tid) == main:
            return None
        total += count or 0
    return total


def _name(tid: str) -> str:
    try:
        with open(os.path.join(_TASKS, tid, "comm"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:  # the thread ended
        return ""


def _involuntary(tid: str) -> int | None:
    try:
        with open(os.path.join(_TASKS, tid, "status"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None

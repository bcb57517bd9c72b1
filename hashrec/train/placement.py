"""CPU cores of a GPU training process and of its loader workers, kept apart.

On a GPU the training step is bound by the host thread that launches its
kernels. Loader workers parse parquet on every core they may use and preempt
that thread at random: on a 16-core H200 host the same training run varied by
a third from one run to the next, and more workers made it slower. So, on Linux
with enough cores, a single training process (its main, autograd and pin-memory
threads, which inherit the main thread's cores) keeps a few cores, and its loader
workers run on the rest.

Under several ranks nothing is pinned: on a 32-core host with 2 H200s, two ranks
confined to 4 cores each trained at 1,603,398 samples/s against 1,916,398 unpinned
(``benchmarks/results/ab_gpu_x2_settings.md``); such a process also runs the
collectives' threads (NCCL's proxy and watchdog threads, the host-side gloo group).

``HASHREC_CPU_AFFINITY=0`` leaves the cores as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass

logger = logging.getLogger("hashrec.train")

MIN_CORES = 6  # a local rank's share below this is left alone


@dataclass(frozen=True)
class CpuPlacement:
    """Cores of the training process (``main``) and of its loader workers."""

    main: tuple[int, ...]
    workers: tuple[int, ...]


def plan_cpu_placement(cores: list[int], workers: int) -> CpuPlacement | None:
    """The training process gets the lowest quarter of ``cores`` (2 to 4 cores), the
    workers the rest. None when there are no workers or fewer than ``MIN_CORES``."""
    cores = sorted(cores)
    if workers < 1 or len(cores) < MIN_CORES:
        return None
    keep = max(2, min(4, len(cores) // 4))
    return CpuPlacement(tuple(cores[:keep]), tuple(cores[keep:]))


def place_training_process(workers: int, world_size: int = 1) -> CpuPlacement | None:
    """Pins this process's threads (and those it starts later) to its cores; returns
    the placement, whose ``workers`` the loaders give their workers
    (``create_dataloader``'s ``worker_cores``). None (nothing
    changed) off Linux, under several ranks, with ``HASHREC_CPU_AFFINITY=0`` or too
    few cores."""
    if os.environ.get("HASHREC_CPU_AFFINITY", "1") == "0" or \
            not hasattr(os, "sched_setaffinity") or world_size > 1 or \
            int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return None
    placement = plan_cpu_placement(list(os.sched_getaffinity(0)), workers)
    if placement is None:
        return None
    os.sched_setaffinity(0, placement.main)
    logger.info("CPU placement: training process on cores %s, %d loader workers on cores %s "
                "(HASHREC_CPU_AFFINITY=0 turns this off)", _ranges(placement.main), workers,
                _ranges(placement.workers))
    return placement


def _ranges(cores: tuple[int, ...]) -> str:
    """``0-3,8`` for (0, 1, 2, 3, 8)."""
    spans, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            spans.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(spans)


# The training thread's longest wait for the GIL on a GPU, in milliseconds
# (``benchmarks/results/gil_switch_interval_gpu.md``); Python's own is 5.
GPU_SWITCH_INTERVAL_MS = 0.5


@contextlib.contextmanager
def gil_switch_interval(device_type: str):
    """While training: ``sys.setswitchinterval`` to ``HASHREC_SWITCH_INTERVAL_MS``
    milliseconds, by default ``GPU_SWITCH_INTERVAL_MS`` on a GPU and Python's own
    elsewhere; restored after.

    The training thread releases the GIL in every PyTorch op; when the pin-memory
    thread takes it meanwhile, the training thread waits to get it back until that
    thread blocks or its switch interval passes. On a GPU, where the step is bound
    by the training thread's launches, a shorter interval trims those waits."""
    value = os.environ.get("HASHREC_SWITCH_INTERVAL_MS", "")
    if value:
        try:
            interval = float(value) / 1000
        except ValueError:
            interval = 0.0
        if not interval > 0:
            raise ValueError(f"HASHREC_SWITCH_INTERVAL_MS={value!r}: expected milliseconds > 0")
    elif device_type == "cuda":
        interval = GPU_SWITCH_INTERVAL_MS / 1000
    else:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(before)

"""Timing and environment helpers shared by the benchmark scripts."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time

import torch


def time_ms(fn, reps: int, warmup: int = 2, setup=None) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` runs (device events on CUDA).

    ``setup(i)``, when given, runs untimed before run ``i`` and its result is passed
    to ``fn``.
    """
    return time_split_ms(fn, reps, warmup, setup)[0]


def time_split_ms(fn, reps: int, warmup: int = 2, setup=None) -> tuple[float, float]:
    """Medians of (elapsed ms, host issue ms) of ``fn()`` over ``reps`` runs.

    Elapsed is timed by device events on CUDA (host clock elsewhere); the host issue
    time is the host clock from the call to its return, before the device finishes.
    When the two are close, ``fn`` run alone is bound by the host. ``setup`` as in
    ``time_ms``.
    """
    cuda = torch.cuda.is_available()
    times, issues = [], []
    for i in range(warmup + reps):
        arg = setup(i) if setup is not None else None
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn() if setup is None else fn(arg)
        issued = (time.perf_counter() - t0) * 1e3
        if cuda:
            end.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            elapsed = issued
        if i >= warmup:
            times.append(elapsed)
            issues.append(issued)
    return statistics.median(times), statistics.median(issues)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), reps=10)
    return 2 * nbytes / (ms * 1e-3)


def environment() -> dict:
    """Date, GPU, torch and triton versions for the results file."""
    import triton
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (cpu)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version()}


def command_line() -> str:
    """The command that ran this benchmark, as typed from the repository root."""
    import sys
    script = "benchmarks/" + os.path.basename(sys.argv[0])
    return " ".join(["python", script, *sys.argv[1:]])


def write_results(prefix: str, results: dict, markdown: str) -> None:
    """Writes ``results`` to ``<prefix>.json`` and ``markdown`` to ``<prefix>.md``."""
    with open(prefix + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(prefix + ".md", "w") as f:
        f.write(markdown)

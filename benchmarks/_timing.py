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


def time_device_ms(fn, reps: int, warmup: int = 2, setup=None) -> dict:
    """Medians of ``fn()`` run two ways: {"device_ms", "call_ms", "issue_ms"}.

    ``call_ms`` is ``time_split_ms``'s elapsed time: the device waits while the host
    issues the work, so host overhead (Python, argument checks, launches) counts.
    ``device_ms`` is the same work with the host's issue hidden: a spin queued on
    the stream ahead of the start event keeps the device busy until every launch of
    ``fn`` is queued, so the events time the device's own work (as a caller that
    queues ahead, or a CUDA graph, would see it). A ``fn`` that reads the device on
    the host waits for the spin, and its ``device_ms`` then includes its host time.
    ``setup(i)`` as in ``time_ms``, with i from 0 to 2 * (warmup + reps) - 1: the
    second timing gets fresh arguments (an insert's batch, say) of its own.
    ``issue_ms`` is the host clock from the call to its return; ``spin_short`` counts
    the timed runs whose spin ended before ``fn`` returned (0 when every one was
    hidden). Elsewhere than CUDA the times are the host clock.
    """
    call_ms, issue_ms = time_split_ms(fn, reps, warmup, setup)
    if not torch.cuda.is_available():
        return {"device_ms": call_ms, "call_ms": call_ms, "issue_ms": issue_ms, "spin_short": 0}
    cycles = int((2 * issue_ms + 0.2) * 1e-3 * _clock_hz())
    times, short = [], 0
    for i in range(warmup + reps):
        arg = setup(warmup + reps + i) if setup is not None else None
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        fn() if setup is None else fn(arg)
        spun_out = start.query()  # the spin ended before the host finished issuing
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
            short += int(spun_out)
    return {"device_ms": statistics.median(times), "call_ms": call_ms, "issue_ms": issue_ms,
            "spin_short": short}


def _clock_hz() -> float:
    """The device's SM clock in Hz (the unit of ``torch.cuda._sleep``)."""
    rate = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0)  # kHz
    return rate * 1e3 if rate else 2.0e9


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

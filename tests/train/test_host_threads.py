"""host_threads: the training threads' CPU share and preemptions between two samples."""

from __future__ import annotations

import os
import threading

import pytest

from hashrec.train import host_threads
from hashrec.train.host_threads import ThreadSample, usage


def test_host_thread_usage_between_two_samples():
    start, end = ThreadSample(1.0, 10), ThreadSample(1.5, 30)
    assert usage(start, end, 2.0, 4) == {"main_thread_cpu_share": 0.25,
                                         "preemptions_per_step": 5.0}
    assert usage(start, ThreadSample(1.5, None), 2.0, 4) == {"main_thread_cpu_share": 0.25}
    assert usage(start, end, 0.0, 0) == {}


def test_preemptions_count_the_main_thread_and_only_autograd_threads_beside_it(monkeypatch):
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc")
    main = str(threading.main_thread().native_id)
    names = {main: "python", "11": "pt_autograd_0", "12": "pin_memory"}
    counts = {main: 3, "11": 4, "12": 100}
    monkeypatch.setattr(host_threads.os, "listdir", lambda path: list(names))
    monkeypatch.setattr(host_threads, "_name", lambda tid: names[tid])
    monkeypatch.setattr(host_threads, "_involuntary", lambda tid: counts[tid])
    assert host_threads._preemptions() == 7
    counts[main] = None  # no count for the main thread: none at all
    assert host_threads._preemptions() is None

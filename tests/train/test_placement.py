"""CPU placement of a GPU training process and its loader workers (one rank only); the GIL
switch interval."""

import os
import sys

import pytest

from hashrec.train import placement
from hashrec.train.placement import (
    GPU_SWITCH_INTERVAL_MS,
    CpuPlacement,
    gil_switch_interval,
    plan_cpu_placement,
)


def test_the_process_keeps_a_quarter_of_the_cores_for_itself():
    assert plan_cpu_placement(list(range(16)), 8) == CpuPlacement(
        (0, 1, 2, 3), tuple(range(4, 16)))
    assert plan_cpu_placement(list(range(8)), 4) == CpuPlacement(
        (0, 1), tuple(range(2, 8)))
    assert plan_cpu_placement(list(range(32, 64)), 8) == CpuPlacement(
        (32, 33, 34, 35), tuple(range(36, 64)))


def test_nothing_is_placed_without_workers_or_with_few_cores():
    assert plan_cpu_placement(list(range(16)), 0) is None
    assert plan_cpu_placement(list(range(5)), 2) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_placing_the_process_sets_its_cores_and_can_be_turned_off(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: calls.append(tuple(cores)))
    monkeypatch.setenv("HASHREC_CPU_AFFINITY", "0")
    assert placement.place_training_process(8) is None and calls == []
    monkeypatch.delenv("HASHREC_CPU_AFFINITY")
    monkeypatch.setenv("WORLD_SIZE", "2")  # several ranks: nothing is pinned
    assert placement.place_training_process(8) is None and calls == []
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert placement.place_training_process(8, world_size=2) is None and calls == []
    placed = placement.place_training_process(8)
    assert calls == [(0, 1, 2, 3)] and placed.workers == tuple(range(4, 16))


def test_core_ranges_read_compactly():
    assert placement._ranges((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"


def test_switch_interval_is_shorter_on_a_gpu_and_restored(monkeypatch):
    monkeypatch.delenv("HASHREC_SWITCH_INTERVAL_MS", raising=False)
    before = sys.getswitchinterval()
    with gil_switch_interval("cuda"):
        assert sys.getswitchinterval() == pytest.approx(GPU_SWITCH_INTERVAL_MS / 1000)
    assert sys.getswitchinterval() == before
    with gil_switch_interval("cpu"):
        assert sys.getswitchinterval() == before
    monkeypatch.setenv("HASHREC_SWITCH_INTERVAL_MS", "2")
    with pytest.raises(RuntimeError, match="inside"):
        with gil_switch_interval("cpu"):
            assert sys.getswitchinterval() == pytest.approx(0.002)
            raise RuntimeError("inside")
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_bad_switch_interval_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("HASHREC_SWITCH_INTERVAL_MS", value)
    with pytest.raises(ValueError, match="HASHREC_SWITCH_INTERVAL_MS"):
        with gil_switch_interval("cuda"):
            pass

"""StepTimer: phases per step, warm-up, sub-phase regions, env switch, embedding backward hook."""

import json
import time

import pytest
import torch

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import InitializerArgs, SparseSGD, TableOptions
from hashrec.train.timing import PHASES, StepTimer, format_phases


def _run_steps(timer, steps, batch_size=4):
    timer.begin()
    for _ in range(steps):
        timer.batch_ready()
        for phase in PHASES:
            if phase == "backward":
                with timer.region("embedding_backward"):
                    pass
            timer.mark(phase)
        timer.end_step(batch_size)


def test_disabled_timer_records_nothing():
    timer = StepTimer(enabled=False)
    _run_steps(timer, 3)
    assert timer.drain() == {} and timer.summary() == {}
    assert timer.write("unused") is None


def test_drain_gives_every_phase_per_step():
    timer = StepTimer(enabled=True)
    _run_steps(timer, 5)
    phases = timer.drain()
    assert set(PHASES) | {"embedding_backward", "dense_backward", "data_wait_host",
                          "step"} == set(phases)
    assert all(value >= 0.0 for value in phases.values())
    assert phases["step"] == pytest.approx(sum(phases[p] for p in PHASES))
    assert phases["dense_backward"] == pytest.approx(
        max(phases["backward"] - phases["embedding_backward"], 0.0))
    assert timer.drain() == {}  # the window was reset
    assert "emb_bwd" in format_phases(phases) and format_phases(phases).endswith("ms/step")


def test_summary_leaves_out_warmup_steps():
    timer = StepTimer(enabled=True, warmup_steps=3, world_size=2)
    _run_steps(timer, 10, batch_size=8)
    summary = timer.summary()
    assert (summary["steps"], summary["warmup_steps"], summary["samples"]) == (7, 3, 56)
    assert summary["global_samples_per_second"] == pytest.approx(
        2 * summary["samples_per_second"])
    assert "step" in summary["phases_ms"]


def test_zero_warmup_measures_every_step():
    timer = StepTimer(enabled=True)
    _run_steps(timer, 4, batch_size=2)
    assert (timer.summary()["steps"], timer.summary()["samples"]) == (4, 8)


def test_summary_lists_the_drained_windows_after_warmup():
    timer = StepTimer(enabled=True, warmup_steps=2, world_size=2)
    _run_steps(timer, 5, batch_size=8)  # 2 warm-up steps, then a window of 3
    timer.drain()
    _run_steps(timer, 4, batch_size=8)
    timer.drain()
    _run_steps(timer, 1, batch_size=8)  # not drained: no window
    windows = timer.summary()["windows"]
    assert [w["steps"] for w in windows] == [3, 4]
    assert all(w["global_samples_per_second"] > 0 for w in windows)
    assert all(w["phases_ms"]["step"] >= 0.0 and "data_wait_host" in w["phases_ms"]
               for w in windows)
    assert "windows" not in StepTimer(enabled=True, warmup_steps=50).summary()


def test_summary_without_enough_steps_says_so():
    timer = StepTimer(enabled=True, warmup_steps=5)
    _run_steps(timer, 2)
    summary = timer.summary()
    assert summary["steps"] == 0 and "note" in summary


def test_negative_warmup_is_rejected():
    with pytest.raises(ValueError, match="warmup_steps"):
        StepTimer(enabled=True, warmup_steps=-1)


def test_from_env_and_write(monkeypatch, tmp_path):
    monkeypatch.delenv("HASHREC_STEP_TIMING", raising=False)
    assert not StepTimer.from_env("cpu").enabled
    monkeypatch.setenv("HASHREC_STEP_TIMING", "1")
    monkeypatch.setenv("HASHREC_STEP_TIMING_WARMUP", "1")
    timer = StepTimer.from_env("cpu")
    assert timer.enabled and timer.warmup_steps == 1
    _run_steps(timer, 3)
    path = timer.write(str(tmp_path), rank=0, extra={"label": "x"})
    data = json.loads(open(path, encoding="utf-8").read())
    assert data["steps"] == 2 and data["label"] == "x"
    assert timer.write(str(tmp_path / "other"), rank=1) is None


class _CountingTimer:
    def __init__(self):
        self.entered = 0

    def region(self):
        import contextlib
        self.entered += 1
        return contextlib.nullcontext()


def test_collection_backward_runs_inside_the_backward_timer():
    options = TableOptions(dim=4, max_capacity=64, bucket_capacity=16,
                           initializer=InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=1))
    collection = EmbeddingCollection([EmbeddingTableSpec("t", 4, dynamic=options)],
                                     [EmbeddingFeatureSpec("f", "t")], SparseSGD(lr=0.1))
    counting = _CountingTimer()
    collection.set_backward_timer(counting)
    kjt = KeyedJaggedTensor.from_lengths(["f"], torch.tensor([1, 2, 3]), torch.tensor([2, 1]))
    collection(kjt).pooled["f"].sum().backward()
    assert counting.entered == 1
    collection.set_backward_timer(None)
    collection(kjt).pooled["f"].sum().backward()
    assert counting.entered == 1


def test_host_clock_on_cuda_reads_no_events(monkeypatch):
    """HASHREC_STEP_TIMING=host: marks on a CUDA timer read the host clock (no CUDA call)."""
    monkeypatch.setenv("HASHREC_STEP_TIMING", "host")
    timer = StepTimer.from_env(torch.device("cuda"))
    assert timer.enabled
    monkeypatch.setattr(torch.cuda, "Event", None)  # any event would fail
    timer.begin()
    timer.batch_ready()
    for phase in ("data_wait", "embedding_forward", "dense_forward"):
        time.sleep(0.002)
        timer.mark(phase)
    timer.end_step(8)
    phases = timer.drain()
    assert all(phases[p] >= 1.5 for p in ("data_wait", "embedding_forward", "dense_forward"))


def test_summary_says_how_much_of_the_host_the_training_threads_got():
    from hashrec.train import host_threads

    timer = StepTimer(enabled=True, warmup_steps=2)
    _run_steps(timer, 2, batch_size=8)
    sum(i * i for i in range(200_000))  # the main thread on the CPU
    _run_steps(timer, 4, batch_size=8)
    threads = timer.summary()["host_threads"]
    assert 0 < threads["main_thread_cpu_share"] <= 1.05
    if host_threads.sample().preemptions is not None:  # Linux
        assert threads["preemptions_per_step"] >= 0
    assert "host_threads" not in StepTimer(enabled=True, warmup_steps=50).summary()


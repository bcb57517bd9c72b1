"""The training progress line: its samples/s counts the training steps' time only."""

from __future__ import annotations

import logging
import re
import types

import pytest
import torch
from small_din import generate_data, small_loop

from hashrec.table import AdmissionOptions, HashTable, TableOptions
from hashrec.train import loop as loop_module
from hashrec.train import progress as progress_module
from hashrec.train.progress import (
    ProgressLog,
    duration,
    format_tables,
    table_counters,
    total_steps,
)


class FakeClock:
    """A ``time`` stand-in for the progress module: ``now`` moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(
        perf_counter=fake.perf_counter))
    return fake


def test_a_paused_block_is_left_out_of_the_rate(clock):
    progress = ProgressLog(every=2)
    progress.record(10, 0.5)
    clock.now += 1.0
    with progress.paused():  # a checkpoint and its evaluation
        clock.now += 50.0
    progress.record(10, 0.5)
    clock.now += 1.0
    assert progress.report(2, {}, {})["samples_per_second"] == pytest.approx(10.0)
    progress.record(10, 0.5)  # the next window starts with nothing paused
    clock.now += 4.0
    assert progress.report(3, {}, {})["samples_per_second"] == pytest.approx(2.5)


def test_checkpoints_and_evaluations_do_not_lower_the_logged_rate(tmp_path, clock, caplog,
                                                                  monkeypatch):
    generate_data(tmp_path / "data", seed=0)
    data = str(tmp_path / "data")
    save = loop_module.checkpoints.save

    def slow_save(*args, **kwargs):  # a save that takes 1000 s on the progress clock
        clock.now += 1000.0
        return save(*args, **kwargs)

    monkeypatch.setattr(loop_module.checkpoints, "save", slow_save)
    edits = {"train_config.save_checkpoints_steps": 1, "train_config.log_step_count_steps": 2,
             "eval_input_path": data, "eval_config.num_steps": 1}
    loop = small_loop(tmp_path / "m", edits=edits)
    original = loop.train_step

    def step(*args, **kwargs):  # each step takes 1 s on the progress clock
        clock.now += 1.0
        return original(*args, **kwargs)

    loop.train_step = step
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        loop.run(data)
    rates = [float(r) for r in re.findall(r"\| ([0-9.]+) samples/s", caplog.text)]
    assert rates == [pytest.approx(256.0)] * 2  # 2 steps of 256 rows in 2 s, each line


def test_the_last_steps_get_a_line_at_the_end(tmp_path, caplog):
    generate_data(tmp_path / "data", seed=0)
    edits = {"train_config.num_steps": 3, "train_config.log_step_count_steps": 2}
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        small_loop(tmp_path / "m", edits=edits).run(str(tmp_path / "data"))
    assert re.findall(r"step (\d+) \| loss", caplog.text) == ["2", "3"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hashrec.train"):  # nothing left: no line
        small_loop(tmp_path / "m2", edits={**edits, "train_config.num_steps": 4}).run(
            str(tmp_path / "data"))
    assert re.findall(r"step (\d+) \| loss", caplog.text) == ["2", "4"]


@pytest.mark.parametrize("seconds,text", [(0.4, "0s"), (45, "45s"), (725, "12m 5s"),
                                          (11220, "3h 07m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("num_steps,max_epochs,epoch_steps,total", [
    (100, None, 0, 100), (0, 2, 30, 60), (100, 2, 30, 60), (50, 2, 30, 50),
    (100, 2, 0, 0), (0, 1, 0, 0)])
def test_total_steps(num_steps, max_epochs, epoch_steps, total):
    assert total_steps(num_steps, max_epochs, epoch_steps) == total


def test_the_line_gives_the_steps_and_the_time_left(clock, caplog):
    progress = ProgressLog(every=2)
    for _ in range(2):
        progress.record(10, 0.5)
        clock.now += 3.0
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        progress.report(2, {}, {}, total=42)  # 40 steps left at 3 s a step
        progress.record(10, 0.5)
        clock.now += 2.0
        progress.report(3, {}, {})  # total not known
    assert "| 3.3 samples/s | 2/42 steps, about 2m 0s left | lr" in caplog.text
    assert "| 5.0 samples/s | lr" in caplog.text


@pytest.mark.parametrize("edits,total", [
    ({"train_config.num_steps": 4}, 4),
    ({"train_config.num_steps": 0, "train_config.num_epochs": 2}, 12)],
    ids=["num_steps", "num_epochs"])
def test_the_loop_gives_its_lines_the_steps_in_all(tmp_path, caplog, edits, total):
    generate_data(tmp_path / "data", seed=0)  # 1,500 rows: 6 batches of 256 an epoch
    edits = {**edits, "train_config.log_step_count_steps": 2}
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        small_loop(tmp_path / "m", edits=edits).run(str(tmp_path / "data"))
    assert f"| 2/{total} steps, about " in caplog.text
    assert f"{total}/{total} steps" not in caplog.text  # nothing left: no time left shown


def test_the_first_window_starts_with_the_first_batch(clock):
    progress = ProgressLog(every=2)
    clock.now += 100.0  # loader workers starting, a resumed epoch's batches skipped
    progress.start()
    for _ in range(2):
        clock.now += 1.0
        progress.record(10, 0.5)
    progress.start()  # a later call changes nothing
    assert progress.report(2, {}, {})["samples_per_second"] == pytest.approx(10.0)


def test_the_loader_start_is_left_out_of_the_first_rate(tmp_path, clock, caplog):
    generate_data(tmp_path / "data", seed=0)
    loop = small_loop(tmp_path / "m", edits={"train_config.log_step_count_steps": 2,
                                             "train_config.num_steps": 2})
    session, original = loop.session, loop.train_step

    def slow_stream(*args, **kwargs):  # a loader that takes 1000 s to start
        clock.now += 1000.0
        return type(session).train_stream(session, *args, **kwargs)

    def step(*args, **kwargs):
        clock.now += 1.0
        return original(*args, **kwargs)

    session.train_stream, loop.train_step = slow_stream, step
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        loop.run(str(tmp_path / "data"))
    assert "| 256.0 samples/s |" in caplog.text


def test_a_full_admission_counter_shows_its_evicted_counts(caplog):
    # 8 counter slots, threshold 3: 8 batches of 8 new ids push counts out of the counter
    admission = AdmissionOptions(threshold=3, counter_capacity=8, counter_bucket_capacity=8)
    table = HashTable(TableOptions(dim=4, max_capacity=256, score_strategy="LFU",
                                   admission=admission))
    for batch in torch.arange(64).view(8, 8):
        table.find_or_insert(batch)
    counters = table_counters({"user_id": table})["user_id"]
    stats = table.stats()
    assert counters["counter_evictions"] == stats["counter_evictions"] == 64 - 8
    assert counters["admission_rejected"] == 64 and counters["size"] == 0
    progress = ProgressLog(every=1)
    progress.record(64, 0.5)
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        progress.report(1, {}, {"user_id": counters})
    assert "user_id size 0 load 0.00 evict 0 reject 64 counter_evict 56" in caplog.text
    counters["counter_evictions"] = 0  # shown only once there are any
    assert format_tables({"user_id": counters}).endswith("reject 64")


def test_a_caching_table_shows_its_cache_hit_rate(caplog):
    table = HashTable(TableOptions(dim=4, max_capacity=1024, cache_load_factor=0.25,
                                   caching=True))
    keys = torch.arange(64)
    for _ in range(4):  # the same 64 keys: the cache holds them after the first read
        table.find_or_insert(keys)
    counters = table_counters({"item": table})["item"]
    stats = table.stats()
    assert counters["cache_lookups"] == stats["cache_lookups"] > 0
    assert counters["cache_hits"] == stats["cache_hits"] > 0
    rate = stats["cache_hits"] / stats["cache_lookups"]
    assert format_tables({"item": counters}).endswith(f"reject 0 cache_hit {rate:.2f}")
    whole = HashTable(TableOptions(dim=4, max_capacity=1024))  # no cache: nothing shown
    assert "cache" not in format_tables(table_counters({"whole": whole}))


def test_a_fused_storage_shows_each_of_its_tables_sizes():
    table = HashTable(TableOptions(dim=4, max_capacity=256))
    table.find_or_insert(torch.arange(9))
    sizes = {"deep": {"user_id": 4, "cate_id": 5}}
    counters = table_counters({"deep": table, "item": HashTable(TableOptions(2, 64))}, sizes)
    assert counters["deep"]["size/user_id"] == 4 and counters["deep"]["size/cate_id"] == 5
    assert format_tables(counters) == ("deep size 9 (user_id 4, cate_id 5) load 0.04 evict 0 "
                                       "reject 0 | item size 0 load 0.00 evict 0 reject 0")


def test_a_fused_storage_shows_each_of_its_tables_rejections_and_refusals():
    admission = AdmissionOptions(threshold=2, counter_capacity=64, counter_bucket_capacity=64)
    table = HashTable(TableOptions(dim=4, max_capacity=8, bucket_capacity=8, admission=admission,
                                   score_strategy="NO_EVICTION", check_mode="IGNORE",
                                   tag_names=("user_id", "cate_id")))
    keys, tags = torch.arange(12), (torch.arange(12) % 3 == 0).to(torch.int32)  # 8 and 4
    table.find_or_insert(keys, tags=tags)  # every key waits
    table.find_or_insert(keys, tags=tags)  # every key admitted: 8 stored, 4 refused
    counters = table_counters({"deep": table}, {"deep": {"user_id": 0, "cate_id": 0}})["deep"]
    refused = counters["refused/user_id"], counters["refused/cate_id"]
    assert sum(refused) == counters["refused"] == 4
    assert format_tables({"deep": counters}).endswith(
        f"reject 12 (user_id 8, cate_id 4) refused 4 (user_id {int(refused[0])}, "
        f"cate_id {int(refused[1])})")

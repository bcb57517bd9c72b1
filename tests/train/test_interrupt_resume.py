"""Stopping on a signal, resuming inside an epoch, and the run's other ends."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal

import pytest
import torch
from small_din import generate_data, small_loop, trained_state

from hashrec.checkpoint import discard_dumps_after, latest_checkpoint
from hashrec.checkpoint.incremental import dump_path
from hashrec.train.errors import TrainError
from hashrec.train.interrupt import StopSignals, Terminated, TrainInterrupted, terminate_raises
from hashrec.train.prefetch import EpochStream

# 1,500 rows in batches of 256: five full batches and one of 220 an epoch.
EPOCH = {"train_config.num_steps": 0, "train_config.num_epochs": 1}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate_data(out, seed=6)
    return out


def record_batches(loop, then=None) -> list[float]:
    """Wrap the loop's step to note each batch trained (its ids' sum); ``then(step)``
    runs after each step."""
    seen, step = [], loop.train_step

    def wrapped(batch, upcoming=None):
        seen.append(float(batch.sparse.values().double().sum()))
        step(batch, upcoming)
        if then is not None:
            then(loop.step)

    loop.train_step = wrapped
    return seen


def test_stop_signals_note_the_first_and_restore_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM and signals.name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):  # a second signal acts at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_terminate_raises_turns_sigterm_into_an_exception_while_entered():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(Terminated), terminate_raises():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            cleaned.append(True)
    assert cleaned == [True] and Terminated.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_epoch_stream_skips_the_first_batches():
    def make(first, count):  # a loader of epochs first, ..., first + count - 1
        epoch = ("a", "b", None, "c", "d")
        items = [(e, b) for e in range(first, first + count) for b in epoch]
        return items, len(epoch), 3  # three batches an epoch for every rank

    stream = EpochStream(make)
    assert list(stream.epoch(0, 2, skip=1)) == ["b", "c"]
    assert list(stream.epoch(1, 2)) == ["a", "b", "c"]


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_signal_saves_and_the_resumed_run_trains_the_rest_of_the_epoch(data_dir, tmp_path,
                                                                       device):
    whole = small_loop(tmp_path / "whole", device, edits=EPOCH)
    expected = record_batches(whole)
    whole.run(str(data_dir))
    assert whole.step == 6 and len(set(expected)) == 6

    model_dir = tmp_path / "model"
    first = small_loop(model_dir, device, edits=EPOCH)
    trained = record_batches(
        first, lambda step: step == 2 and os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(TrainInterrupted, match="stopped by SIGTERM at step 2") as stop:
        first.run(str(data_dir))
    assert stop.value.exit_code == 143
    path = latest_checkpoint(str(model_dir))
    assert path.endswith("model.ckpt-2")
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
        extra = json.load(f)["extra"]
    assert extra["epoch"] == 0 and extra["epoch_step"] == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    second = small_loop(model_dir, device, edits=EPOCH, continue_train=True)
    rest = record_batches(second)
    second.run(str(data_dir))
    assert second.step == 6 and second.epoch == 1
    assert trained + rest == expected
    # The random generators' states travel with the checkpoint: dropout and the rows
    # first inserted after the resume draw what the uninterrupted run drew (on a GPU
    # also the seeds of the in-kernel initializers, a sequence of the table's own).
    want, got = trained_state(whole), trained_state(second)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_a_damaged_rank_state_stops_a_resume_but_not_eval_or_export(data_dir, tmp_path):
    from hashrec.checkpoint import CheckpointError
    from hashrec.config import apply_edit_config_json
    from hashrec.export import export_model
    from hashrec.train import evaluate_checkpoint

    model_dir = tmp_path / "model"
    loop = small_loop(model_dir, edits={**EPOCH, "train_config.num_steps": 2})
    loop.run(str(data_dir))
    path = latest_checkpoint(str(model_dir))
    state = os.path.join(path, "rank_state", "rank-00000-of-00001.pt")
    with open(state, "r+b") as f:
        f.truncate(os.path.getsize(state) // 2)
    config = apply_edit_config_json(loop.session.config, {"eval_input_path": str(data_dir)})
    assert evaluate_checkpoint(config, path)["step"] == 2
    assert export_model(config, str(tmp_path / "export"), path).step == 2
    with pytest.raises(CheckpointError, match=rf"^{state}: \d+ bytes, meta.json says \d+ "
                                              r"\(truncated or overwritten\); .* delete it "
                                              r"to resume"):
        small_loop(model_dir, edits={**EPOCH, "train_config.num_steps": 4},
                   continue_train=True)


def test_another_batch_size_skips_as_many_rows_as_were_trained(data_dir, tmp_path, caplog):
    model_dir = tmp_path / "model"
    small = {**EPOCH, "data_config.batch_size": 128}
    small_loop(model_dir, edits={**small, "train_config.num_steps": 3}).run(str(data_dir))
    # 3 batches of 128 trained: the first batch of 256 is skipped (128 rows train again).
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        loop = small_loop(model_dir, edits={**EPOCH, "train_config.num_steps": 5},
                          continue_train=True)
    assert ("(ranks, loader workers, batch size: (1, 0, 256), were (1, 0, 128)): the "
            "resumption is only approximate. Epoch 0 had trained 3 batches per rank (384 "
            "rows); each rank skips the first 1 batches of its share now (256 rows)"
            ) in caplog.text
    loop.run(str(data_dir))
    path = latest_checkpoint(str(model_dir))
    with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
        extra = json.load(f)["extra"]
    assert (extra["epoch_step"], extra["readers"]) == (3, [1, 0, 256])  # in 256-row batches
    # The same layout again: the 3 batches saved are skipped, the epoch's last 3 trained.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        last = small_loop(model_dir, edits=EPOCH, continue_train=True)
    sizes = []
    last.train_step = lambda batch, upcoming=None, step=last.train_step: (
        sizes.append(batch.batch_size), step(batch, upcoming))
    last.run(str(data_dir))
    assert "approximate" not in caplog.text
    assert sizes == [256, 256, 220] and (last.step, last.epoch) == (8, 1)


def test_resumed_run_moves_the_lost_dumps_aside(data_dir, tmp_path):
    model_dir = tmp_path / "model"
    edits = {**EPOCH, "train_config.incremental_dump_steps": 1,
             "train_config.save_checkpoints_steps": 2, "train_config.num_steps": 3}
    small_loop(model_dir, edits=edits).run(str(data_dir))
    dumps = model_dir / "incremental"
    # The run saved steps 2 and 3; as if it had been killed after dumping step 3 but
    # before its last save:
    os.rename(model_dir / "model.ckpt-3", tmp_path / "lost")
    loop = small_loop(model_dir, edits={**edits, "train_config.num_steps": 4},
                      continue_train=True)
    moved = [p for p in os.listdir(dumps) if p.startswith("discarded-")]
    assert len(moved) == 1 and os.listdir(dumps / moved[0]) == [
        os.path.basename(dump_path(str(dumps), 3))]
    loop.run(str(data_dir))
    with open(os.path.join(dump_path(str(dumps), 3), "meta.json"), encoding="utf-8") as f:
        assert json.load(f)["kind"] == "full"  # a new chain starts after a resume


@pytest.mark.parametrize("continue_train", [True, False], ids=["continue", "fresh"])
def test_a_fresh_start_moves_the_dumps_of_a_run_without_checkpoint_aside(
        data_dir, tmp_path, caplog, continue_train):
    model_dir = tmp_path / "model"
    edits = {**EPOCH, "train_config.incremental_dump_steps": 1,
             "train_config.save_checkpoints_steps": 100, "train_config.num_steps": 2}
    small_loop(model_dir, edits=edits).run(str(data_dir))
    dumps = model_dir / "incremental"
    # As if the run had been killed after dumping steps 1 and 2 but before any save:
    shutil.rmtree(model_dir / "model.ckpt-2")
    assert latest_checkpoint(str(model_dir)) is None
    with caplog.at_level(logging.WARNING, logger="hashrec.train"):
        loop = small_loop(model_dir, edits=edits, continue_train=continue_train)
        loop.run(str(data_dir))
    (moved,) = [p for p in os.listdir(dumps) if p.startswith("discarded-")]
    assert sorted(os.listdir(dumps / moved)) == [
        os.path.basename(dump_path(str(dumps), step)) for step in (1, 2)]
    assert f"moved to {dumps / moved}" in caplog.text
    assert loop.step == 2
    with open(os.path.join(dump_path(str(dumps), 1), "meta.json"), encoding="utf-8") as f:
        assert json.load(f)["kind"] == "full"


def test_discard_dumps_after_leaves_earlier_ones(tmp_path):
    for step in (5, 10, 15):
        os.makedirs(dump_path(str(tmp_path), step))
    os.makedirs(dump_path(str(tmp_path), 20) + ".tmp")
    moved = discard_dumps_after(str(tmp_path), 10)
    assert sorted(os.listdir(moved)) == ["dump-000000000015", "dump-000000000020.tmp"]
    assert discard_dumps_after(str(tmp_path), 10) is None
    assert discard_dumps_after(str(tmp_path / "none"), 0) is None


def test_save_checkpoints_epochs_replaces_the_step_interval(data_dir, tmp_path, caplog):
    # as in TorchEasyRec: with save_checkpoints_epochs set, no save every 2 steps
    edits = {**EPOCH, "train_config.save_checkpoints_steps": 2,
             "train_config.save_checkpoints_epochs": 1}
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        small_loop(tmp_path / "model", edits=edits).run(str(data_dir))
    assert caplog.text.count("saved checkpoint") == 1
    assert "model.ckpt-6" in caplog.text
    assert "training ends at step 6: 1 of num_epochs 1 done" in caplog.text


def test_nothing_to_train_says_so(data_dir, tmp_path, caplog):
    model_dir = tmp_path / "model"
    small_loop(model_dir, edits={"train_config.num_steps": 2}).run(str(data_dir))
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        loop = small_loop(model_dir, edits={"train_config.num_steps": 2},
                          continue_train=True)
        assert loop.run(str(data_dir)) is None
    assert "nothing to train: training ends at step 2: num_steps 2 reached" in caplog.text


def test_evaluation_logs_its_progress(data_dir, tmp_path, caplog):
    from hashrec.train.evaluation import evaluate

    loop = small_loop(tmp_path / "model", edits={"eval_config.log_step_count_steps": 2})
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        result = evaluate(loop.session, str(data_dir), 0)
    assert result["num_examples"] == 1500
    assert "eval at step 0: 2 of 6 batches" in caplog.text
    assert "eval at step 0: 6 of 6 batches" in caplog.text


def test_evaluating_on_the_way_leaves_the_training_run_as_it_was(data_dir, tmp_path):
    edits = {**EPOCH, "train_config.num_steps": 5}
    plain = small_loop(tmp_path / "plain", edits=edits)
    plain.run(str(data_dir))
    evaluated = small_loop(tmp_path / "evaluated", edits={
        **edits, "train_config.save_checkpoints_steps": 2, "eval_input_path": str(data_dir)})
    evaluated.run(str(data_dir))
    assert (tmp_path / "evaluated" / "eval_result.txt").read_text().count("\n") == 3
    want, got = trained_state(plain), trained_state(evaluated)
    assert want.keys() == got.keys()
    assert [name for name in want if not torch.equal(want[name], got[name])] == []


def test_a_diverged_model_is_not_saved(data_dir, tmp_path):
    edits = {"train_config.num_steps": 6, "train_config.save_checkpoints_steps": 2,
             "train_config.log_step_count_steps": 100}
    # A learning rate that blows the dense weights up: the first save refuses.
    blown = small_loop(tmp_path / "blown", edits={
        **edits, "train_config.dense_optimizer.adam_optimizer.lr": 1e30})
    with pytest.raises(TrainError, match=r"loss is nan at step 2 \(the mean of the last 2 "
                                         r"step\(s\)\): the model diverged"):
        blown.run(str(data_dir))
    assert latest_checkpoint(str(tmp_path / "blown")) is None
    # A loss that turns NaN after the save of step 2: that checkpoint stays the latest,
    # and the run stops at its next save instead of writing the NaN model over it.
    model_dir = tmp_path / "model"
    loop = small_loop(model_dir, edits=edits)
    record = loop.progress.record
    loop.progress.record = lambda size, loss, parts=None: record(
        size, loss if loop.step < 3 else loss * float("nan"), parts)
    with pytest.raises(TrainError, match="loss is nan at step 4"):
        loop.run(str(data_dir))
    assert latest_checkpoint(str(model_dir)).endswith("model.ckpt-2")
    assert not os.path.exists(os.path.join(model_dir, "model.ckpt-4"))


def test_a_diverged_loss_stops_at_the_log_line(data_dir, tmp_path):
    loop = small_loop(tmp_path / "model", edits={
        "train_config.num_steps": 6, "train_config.log_step_count_steps": 1,
        "train_config.dense_optimizer.adam_optimizer.lr": 1e30})
    with pytest.raises(TrainError, match=r"loss is (nan|inf) at step \d \(the mean of the "
                                         r"last 1 step\(s\)\)"):
        loop.run(str(data_dir))
    assert loop.step < 6 and latest_checkpoint(str(tmp_path / "model")) is None


def signal_during_evaluation(loop, signum, after: int = 1) -> list[int]:
    """Send ``signum`` to this process once the evaluation has read ``after`` batches;
    returns the number of batches each evaluation read."""
    counts, make = [], loop.session.loader

    def loader(path, mode, epoch=0):
        batches = make(path, mode, epoch)
        if mode != "eval":
            return batches

        class Counted:  # the eval loader, its batches counted
            dataset, num_workers = batches.dataset, batches.num_workers

            def __iter__(self):
                counts.append(0)
                for batch in batches:
                    if counts[-1] == after:
                        os.kill(os.getpid(), signum)
                    counts[-1] += 1
                    yield batch
        return Counted()

    loop.session.loader = loader
    return counts


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["sigterm", "sigint"])
def test_a_signal_in_the_final_evaluation_stops_it_and_the_run(data_dir, tmp_path, caplog,
                                                               signum, code):
    model_dir = tmp_path / "model"
    loop = small_loop(model_dir, edits={"train_config.num_steps": 2,
                                        "eval_input_path": str(data_dir)})
    counts = signal_during_evaluation(loop, signum)
    with caplog.at_level(logging.INFO, logger="hashrec.train"), \
            pytest.raises(TrainInterrupted, match=r"in the evaluation at step 2; training is "
                                                  r"complete and the checkpoint of step 2 is "
                                                  r"saved; run again with --continue_train "
                                                  r"\(or python -m hashrec.eval\) to "
                                                  r"evaluate it") as stop:
        loop.run(str(data_dir))
    assert stop.value.exit_code == code
    # Of the six eval batches, the second is read with the signal noted and not evaluated.
    assert counts == [2]
    assert "eval at step 2 cut short by" in caplog.text
    assert latest_checkpoint(str(model_dir)).endswith("model.ckpt-2")
    assert not (model_dir / "eval_result.txt").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_in_an_evaluation_after_a_save_ends_training(data_dir, tmp_path):
    model_dir = tmp_path / "model"
    loop = small_loop(model_dir, edits={"train_config.num_steps": 4,
                                        "train_config.save_checkpoints_steps": 2,
                                        "eval_input_path": str(data_dir)})
    counts = signal_during_evaluation(loop, signal.SIGTERM)
    with pytest.raises(TrainInterrupted, match="stopped by SIGTERM in the evaluation at step "
                                               "2; the checkpoint of step 2 is saved; run "
                                               "again with --continue_train"):
        loop.run(str(data_dir))
    assert loop.step == 2 and counts == [2]
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*")) == ["model.ckpt-2"]
    assert not (model_dir / "eval_result.txt").exists()
    # The resumed run evaluates the checkpoint whose evaluation was cut, then trains on.
    again = small_loop(model_dir, edits={"train_config.num_steps": 4,
                                         "train_config.save_checkpoints_steps": 2,
                                         "eval_input_path": str(data_dir)},
                       continue_train=True)
    again.run(str(data_dir))
    results = [json.loads(line) for line in (model_dir / "eval_result.txt").read_text()
               .splitlines()]
    assert [(r["step"], os.path.basename(r["checkpoint"])) for r in results] == [
        (2, "model.ckpt-2"), (4, "model.ckpt-4")]


def test_a_resume_evaluates_only_a_due_checkpoint_without_a_result(data_dir, tmp_path):
    """A final checkpoint whose evaluation never ran (a crash) is evaluated by the resumed
    run, which has nothing left to train; one saved on a stop signal between the
    scheduled saves is not (the schedule never evaluates it)."""
    edits = {"train_config.num_steps": 3, "train_config.save_checkpoints_steps": 2,
             "eval_input_path": str(data_dir)}
    stopped = small_loop(tmp_path / "stopped", edits=edits)
    record_batches(stopped, lambda step: step == 1 and os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(TrainInterrupted, match="at step 1; the checkpoint of step 1"):
        stopped.run(str(data_dir))
    assert not (tmp_path / "stopped" / "eval_result.txt").exists()
    resumed = small_loop(tmp_path / "stopped", edits=edits, continue_train=True)
    resumed.run(str(data_dir))
    results = (tmp_path / "stopped" / "eval_result.txt").read_text().splitlines()
    assert [json.loads(line)["step"] for line in results] == [2, 3]

    crashed = tmp_path / "crashed"
    small_loop(crashed, edits={**edits, "eval_input_path": ""}).run(str(data_dir))
    assert not (crashed / "eval_result.txt").exists()  # as if killed in the evaluations
    (crashed / "eval_result.txt").write_text('{"step": 2, "checkpoint": "x/model.ckpt-2"}\n'
                                             '{"step": 3, "checkpo')  # a line cut short
    final = small_loop(crashed, edits=edits, continue_train=True)
    assert final.done()
    final.run(str(data_dir))
    lines = (crashed / "eval_result.txt").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["step"] == 3



def test_a_longer_resumed_run_evaluates_the_last_checkpoint_a_crash_left_unevaluated(
        data_dir, tmp_path, monkeypatch):
    """The run of 3 steps crashed in its final evaluation; the resumed run trains to 6,
    whose schedule (every 2 steps) never evaluates step 3: the checkpoint's record
    does."""
    from hashrec.train import checkpoint_schedule

    edits = {"train_config.num_steps": 3, "train_config.save_checkpoints_steps": 2,
             "eval_input_path": str(data_dir)}
    real = checkpoint_schedule.evaluate_model

    def crash_at_3(session, path, step, *args):
        if step == 3:
            raise RuntimeError("killed in the evaluation")
        return real(session, path, step, *args)

    monkeypatch.setattr(checkpoint_schedule, "evaluate_model", crash_at_3)
    with pytest.raises(RuntimeError, match="killed"):
        small_loop(tmp_path, edits=edits).run(str(data_dir))
    monkeypatch.setattr(checkpoint_schedule, "evaluate_model", real)
    steps = [json.loads(line)["step"]
             for line in (tmp_path / "eval_result.txt").read_text().splitlines()]
    assert steps == [2]
    small_loop(tmp_path, edits={**edits, "train_config.num_steps": 6},
               continue_train=True).run(str(data_dir))
    steps = [json.loads(line)["step"]
             for line in (tmp_path / "eval_result.txt").read_text().splitlines()]
    assert steps == [2, 3, 4, 6]

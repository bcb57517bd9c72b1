import logging

import pytest
import torch
from small_din import CONFIG, small_loop

from hashrec.checkpoint import CheckpointError
from hashrec.config import apply_edit_config_json, load_pipeline_config
from hashrec.data.errors import DataError
from hashrec.tools.gen_taobao_data import generate
from hashrec.train import run
from hashrec.train.checkpoints import check_model_dir, resolve_checkpoint, restore_resolved
from hashrec.train.errors import TrainError
from hashrec.train.loop import LoopOptions
from hashrec.train.progress import ProgressLog, format_tables


@pytest.mark.parametrize("steps,epochs,expected", [(0, 0, 1), (100, 0, None), (100, 3, 3),
                                                   (0, 2, 2)],
                         ids=["default-one-epoch", "steps-only", "both", "epochs"])
def test_max_epochs(steps, epochs, expected):
    assert LoopOptions(num_steps=steps, num_epochs=epochs).max_epochs == expected


def test_check_model_dir(tmp_path):
    check_model_dir(str(tmp_path), continue_train=False)
    (tmp_path / "model.ckpt-10.tmp").mkdir()  # a save that never finished: no checkpoint
    check_model_dir(str(tmp_path), continue_train=False)
    (tmp_path / "model.ckpt-10").mkdir()
    with pytest.raises(TrainError, match="--continue_train"):
        check_model_dir(str(tmp_path), continue_train=False)
    check_model_dir(str(tmp_path), continue_train=True)


def _checkpoint(path, complete: bool = True) -> None:
    path.mkdir()
    if complete:
        (path / "DONE").write_text("{}")


def test_check_model_dir_names_the_latest_of_several(tmp_path):
    for step in (5, 40, 100):
        _checkpoint(tmp_path / f"model.ckpt-{step}", complete=step != 100)
    with pytest.raises(TrainError, match=r"already holds 3 checkpoints \(the latest "
                                         r"model\.ckpt-100\); pass --continue_train"):
        check_model_dir(str(tmp_path), continue_train=False)


def test_check_model_dir_counts_a_replaced_copy(tmp_path):
    # A save of step 40 again, interrupted while swapping the copies: the old copy aside
    # is the step's checkpoint, which the next save would rename back.
    _checkpoint(tmp_path / "model.ckpt-40.replaced")
    _checkpoint(tmp_path / "model.ckpt-40.tmp")
    with pytest.raises(TrainError, match=r"already holds a checkpoint "
                                         r"\(model\.ckpt-40\.replaced\)"):
        check_model_dir(str(tmp_path), continue_train=False)
    check_model_dir(str(tmp_path), continue_train=True)


def test_check_model_dir_ignores_an_incomplete_replaced_copy(tmp_path):
    _checkpoint(tmp_path / "model.ckpt-40.replaced", complete=False)  # the next save drops it
    check_model_dir(str(tmp_path), continue_train=False)


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_missing_input_path_is_reported_before_the_model_is_built(which, tmp_path,
                                                                    monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.parquet").touch()
    paths = {"train": str(tmp_path / "data"), "eval": str(tmp_path / "data")}
    paths[which] = str(tmp_path / "nope")
    config = apply_edit_config_json(load_pipeline_config(CONFIG), {
        "model_dir": str(tmp_path / "model"), "train_input_path": paths["train"],
        "eval_input_path": paths["eval"]})

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the input paths were checked")

    monkeypatch.setattr(run, "build_session", no_model)
    with pytest.raises(DataError, match="nope' does not exist"):
        run.train_and_evaluate(config)
    if which == "eval":
        monkeypatch.setattr(run.checkpoints, "resolve_checkpoint", lambda path, best=None: path)
        with pytest.raises(DataError, match="nope' does not exist"):
            run.evaluate_checkpoint(config)


def test_resolve_checkpoint_errors(tmp_path):
    with pytest.raises(TrainError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(TrainError, match="no complete checkpoint"):
        resolve_checkpoint(str(tmp_path))
    (tmp_path / "model.ckpt-5").mkdir()
    assert resolve_checkpoint(str(tmp_path / "model.ckpt-5")).endswith("model.ckpt-5")
    (tmp_path / "model.ckpt-5" / "model").mkdir()  # a TorchEasyRec checkpoint
    (tmp_path / "model.ckpt-5" / "model" / ".metadata").write_bytes(b"\0")
    with pytest.raises(TrainError, match=rf"^{tmp_path} \(its model\.ckpt-5\): holds "
                                         r"torch\.distributed\.checkpoint shards"):
        resolve_checkpoint(str(tmp_path))


def test_restore_resolved_names_a_checkpoint_pruned_while_read(tmp_path):
    (tmp_path / "model.ckpt-5").mkdir()
    (tmp_path / "model.ckpt-5" / "DONE").write_text("{}")

    def pruned(path):
        (tmp_path / "model.ckpt-5" / "DONE").unlink()
        (tmp_path / "model.ckpt-5").rmdir()
        raise CheckpointError(f"{path}: checkpoint directory does not exist")

    assert restore_resolved(str(tmp_path), lambda path: 7) == (
        str(tmp_path / "model.ckpt-5"), 7)
    with pytest.raises(TrainError, match="removed while it was read.*keep_checkpoint_max"):
        restore_resolved(str(tmp_path), pruned)
    (tmp_path / "model.ckpt-6").mkdir()
    with pytest.raises(CheckpointError, match="truncated"):  # named itself: its own error
        restore_resolved(str(tmp_path / "model.ckpt-6"),
                         lambda path: (_ for _ in ()).throw(CheckpointError("truncated")))


def test_progress_throttle_and_line(caplog):
    progress = ProgressLog(every=2)
    assert not progress.due(1) and progress.due(2) and not ProgressLog(0).due(2)
    progress.record(10, torch.tensor(0.5))
    progress.record(10, 0.7)
    counters = {"user_id": {"size": 5, "capacity": 8, "load_factor": 0.625, "evictions": 1,
                            "refused": 0, "admission_rejected": 3}}
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        window = progress.report(2, {"dense": 0.1}, counters)
    assert window["loss"] == pytest.approx(0.6)
    assert "step 2 | loss 0.60000" in caplog.text
    assert "user_id size 5 load 0.62 evict 1 reject 3\n" in caplog.text
    counters["user_id"]["refused"] = 4
    assert format_tables(counters) == "user_id size 5 load 0.62 evict 1 reject 3 refused 4"


def test_progress_shows_each_tasks_loss(caplog):
    progress = ProgressLog(every=2)
    progress.record(10, torch.tensor(0.5), {"binary_cross_entropy_ctr": torch.tensor(0.2),
                                            "l2_loss_time": torch.tensor(0.3)})
    progress.record(10, torch.tensor(0.7), {"binary_cross_entropy_ctr": torch.tensor(0.4),
                                            "l2_loss_time": torch.tensor(0.3)})
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        window = progress.report(2, {"dense": 0.1}, {})
    assert window["loss/binary_cross_entropy_ctr"] == pytest.approx(0.3)
    assert ("loss 0.60000 (binary_cross_entropy_ctr 0.30000, l2_loss_time 0.30000)"
            in caplog.text)
    progress.record(10, 0.5, {"binary_cross_entropy": torch.tensor(0.5)})  # one: no parts
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        assert set(progress.report(4, {}, {})) == {"loss", "samples_per_second"}
    assert "step 4 | loss 0.50000 |" in caplog.text


def test_progress_shows_the_solved_loss_weights(caplog):
    progress = ProgressLog(every=2)
    parts = {"binary_cross_entropy_a": torch.tensor(0.2), "binary_cross_entropy_b":
             torch.tensor(0.4)}
    for weight in (0.3, 0.5):
        progress.record(10, torch.tensor(0.3), parts)
        progress.record_weights({"binary_cross_entropy_a": torch.tensor(weight),
                                 "binary_cross_entropy_b": torch.tensor(1 - weight)})
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        window = progress.report(2, {"dense": 0.1}, {})
    assert window["loss_weight/binary_cross_entropy_a"] == pytest.approx(0.4)
    assert window["loss_weight/binary_cross_entropy_b"] == pytest.approx(0.6)
    assert ("loss 0.30000 (binary_cross_entropy_a 0.20000, binary_cross_entropy_b 0.40000) | "
            "loss weights (binary_cross_entropy_a 0.40000, binary_cross_entropy_b 0.60000) | "
            in caplog.text)
    progress.record(10, torch.tensor(0.3), parts)  # a window without solved weights
    assert not any(name.startswith("loss_weight/") for name in progress.report(4, {}, {}))


def test_progress_silent_off_rank_zero(caplog):
    progress = ProgressLog(every=1, rank=1)
    progress.record(1, 0.1)
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        progress.report(1, {}, {})
    assert caplog.text == ""
    assert format_tables({}) == ""


def test_restore_for_training_says_what_it_did_without_a_checkpoint(tmp_path, caplog):
    from hashrec.train.checkpoints import Resume, restore_for_training

    class Model:
        class embedding:  # noqa: N801 - stands in for the model's attribute
            @staticmethod
            def dynamic_tables():
                return {}

    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        assert restore_for_training(str(tmp_path), Model, None, True, None) == Resume()
        assert restore_for_training(str(tmp_path), Model, None, False, None,
                                    restore_optimizer=False) == Resume()
    assert "holds no checkpoint yet; starting fresh" in caplog.text
    assert "--ignore_restore_optimizer has no effect without --continue_train" in caplog.text


def test_restore_for_training_says_that_a_resumed_run_does_not_fine_tune(tmp_path, caplog):
    from hashrec.checkpoint import save_checkpoint
    from hashrec.train.checkpoints import restore_for_training

    class Model(torch.nn.Linear):
        class embedding:  # noqa: N801 - stands in for the model's attribute
            @staticmethod
            def dynamic_tables():
                return {}

    model_dir, other = str(tmp_path / "m"), str(tmp_path / "other")
    save_checkpoint(model_dir, 5, Model(2, 2), None, {})
    dense = type("Dense", (), {"optimizers": None})
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        resume = restore_for_training(model_dir, Model(2, 2), dense, True, other)
    assert resume.step == 5
    assert (f"fine-tune checkpoint {other} is not used: the run continues from its own "
            f"checkpoint") in caplog.text


def test_a_rank_without_a_batch_is_told_that_shares_are_cut_at_whole_batches(tmp_path):
    # 1000 rows in batches of 512 over 3 ranks: one full batch, and shares of 488 (the
    # rows left over), 0 and 512 rows; every rank trains as many steps as the fewest, none.
    # One process reading rank 0's share stands in: the counts follow from the row count.
    generate(str(tmp_path / "data"), 1000, seed=3, scale=0.001, quiet=True)
    loop = small_loop(tmp_path / "model", edits={"data_config.batch_size": 512}, world_size=3)
    with pytest.raises(TrainError) as info:
        loop.run(str(tmp_path / "data"))
    assert str(info.value) == (
        f"train input {str(tmp_path / 'data')!r} gave no batches in epoch 0: rank 1 of 3 got "
        f"no batch, and every rank trains as many steps as the rank with the fewest. The "
        f"shares are cut at whole batches: the 1000 rows make 1 full batch of "
        f"data_config.batch_size 512 (plus 488 rows, a partial batch of rank 0) for 3 readers "
        f"(3 ranks without loader workers); lower data_config.batch_size to at most 333, or "
        f"use fewer ranks")


def test_the_progress_line_and_tensorboard_give_zch_tables_counters(tmp_path, caplog,
                                                                     monkeypatch):
    """A ZCH table's counters join the dynamic tables' in the line and under
    table/<name>/ in TensorBoard, as rank 0 counts them (the table is replicated)."""
    from test_session import CONFIG as ZCH_CONFIG

    from hashrec.train.checkpoints import Resume
    from hashrec.train.loop import TrainLoop
    from hashrec.train.session import build_session

    path = tmp_path / "zch.config"
    path.write_text(ZCH_CONFIG)
    config = load_pipeline_config(str(path))
    config.model_dir = str(tmp_path / "model")
    session = build_session(config, device=torch.device("cpu"))
    loop = TrainLoop(session, LoopOptions.from_config(config), Resume())
    remapper = session.model.embedding.zch_remappers["user_id"]
    remapper.remap(torch.arange(20), train=True)  # 16 rows for 20 ids: 4 wait
    written = {}
    monkeypatch.setattr(loop.summaries, "tables",
                        lambda step, counters: written.update(counters))
    loop.progress.record(8, torch.tensor(0.5))
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        loop._report_progress()
    assert "| user_id size 16 load 1.00 assigned 16 evict 0 no_row 4" in caplog.text
    assert written["user_id"]["without_row"] == 4 and written["user_id"]["assigned"] == 16

"""train_metrics: metrics of the training batches, decayed every decay_step steps, in the
progress line and TensorBoard; checked against a computation of their own."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tiny_pipeline import MULTI_TOWER, pipeline_text

from hashrec.config import parse_pipeline_config
from hashrec.models.tasks import model_tasks
from hashrec.train import checkpoints
from hashrec.train.errors import TrainError
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.metrics import check_metrics
from hashrec.train.session import build_session
from hashrec.train.train_metrics import TrainMetrics

RATE, EVERY, BINS = 0.6, 3, 50
TRAIN_METRICS = "".join(
    f"train_metrics {{ {metric} decay_rate: {RATE} decay_step: {EVERY} }} "
    for metric in (f"auc {{ thresholds: {BINS} }}", "accuracy {}", "mean_absolute_error {}"))


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 30, rows)
    price = rng.random(rows)
    clicked = (rng.random(rows) < 0.2 + 0.6 * (users % 2)).astype(np.int64)
    return pa.table({"user_id": users, "price": price, "clk": clicked})


def _config(root, model: str = MULTI_TOWER + " " + TRAIN_METRICS):
    return parse_pipeline_config(pipeline_text(root, '"clk"', model, epochs=1))


# The decay rate as the config holds it (a float)
DECAY = float(np.float32(RATE))


def _decayed(values: list[float]) -> float:
    """TorchEasyRec's running value of per-window values."""
    out = values[0]
    for value in values[1:]:
        out = DECAY * out + (1 - DECAY) * value
    return out


def _decayed_auc(windows: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The AUC of every row pair, each row weighted as the decayed histograms weigh its
    window and scored by its threshold bin (ties count 1/2)."""
    n = len(windows)
    thresholds = np.linspace(0, 1, BINS, dtype=np.float32)
    scores, labels, weights = [], [], []
    for k, (probs, label) in enumerate(windows):
        scores.append(np.searchsorted(thresholds, probs.astype(np.float32), side="right") - 1)
        labels.append(label > 0.5)
        weight = DECAY ** (n - 1) if k == 0 else (1 - DECAY) * DECAY ** (n - 1 - k)
        weights.append(np.full(len(probs), weight))
    s, y, w = (np.concatenate(a) for a in (scores, labels, weights))
    pos_s, pos_w, neg_s, neg_w = s[y], w[y], s[~y], w[~y]
    order = (pos_s[:, None] > neg_s[None, :]) + 0.5 * (pos_s[:, None] == neg_s[None, :])
    return float((pos_w[:, None] * neg_w[None, :] * order).sum()
                 / (pos_w.sum() * neg_w.sum()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Ten steps of the tiny model with the train metrics, every step's predictions and
    labels as the metrics read them, and the loop."""
    root = tmp_path_factory.mktemp("train_metrics")
    (root / "data").mkdir()
    pq.write_table(_table(640, 0), root / "data" / "train.parquet")
    pq.write_table(_table(64, 1), root / "data" / "eval.parquet")
    config = _config(root)
    torch.manual_seed(0)
    session = build_session(config, device=torch.device("cpu"))
    loop = TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())
    session.model.train()
    seen = []
    update = loop.train_metrics.update

    def record(predictions, batch, step):
        seen.append((predictions["probs"].detach().clone().numpy(),
                     batch.labels["clk"].clone().numpy(), step))
        update(predictions, batch, step)

    loop.train_metrics.update = record
    for batch in session.loader(str(root / "data" / "train.parquet"), "train"):
        loop.train_step(batch)
    return loop, seen


def test_the_values_are_the_decayed_windows(trained):
    loop, seen = trained
    assert [step for _, _, step in seen] == list(range(1, 11))
    folded = len(seen) // EVERY * EVERY  # the steps after the last fold wait for the next
    windows = [(np.concatenate([p for p, _, _ in seen[i:i + EVERY]]),
                np.concatenate([y for _, y, _ in seen[i:i + EVERY]]))
               for i in range(0, folded, EVERY)]
    values = loop.train_metrics.values()
    assert set(values) == {"auc", "accuracy", "mean_absolute_error"}
    assert values["accuracy"] == pytest.approx(
        _decayed([float(((p > 0.5) == (y > 0.5)).mean()) for p, y in windows]), rel=1e-9)
    assert values["mean_absolute_error"] == pytest.approx(
        _decayed([float(np.abs(p - y).mean()) for p, y in windows]), rel=1e-6)
    assert values["auc"] == pytest.approx(_decayed_auc(windows), rel=1e-9)
    # the decayed AUC is not the decay of the windows' AUCs
    assert 0.5 < values["auc"] < 1.0


def test_the_progress_line_and_tensorboard_show_them(trained, caplog, monkeypatch):
    loop, _ = trained
    written = {}
    monkeypatch.setattr(loop.summaries, "scalars",
                        lambda step, values, prefix="": written.update(values))
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        loop._report_progress()
    values = loop.train_metrics.values()
    line = (f"| train auc {values['auc']:.5f} accuracy {values['accuracy']:.5f} "
            f"mean_absolute_error {values['mean_absolute_error']:.5f} |")
    assert line in caplog.text
    assert {k: v for k, v in written.items() if k.startswith("train_metric/")} == {
        f"train_metric/{k}": v for k, v in values.items()}


def test_before_the_first_fold_no_value_is_shown():
    metrics = TrainMetrics(model_tasks(_config("/r").model_config, ["clk"]))
    labels = {"clk": torch.tensor([0.0, 1.0])}
    batch = type("Batch", (), {"labels": labels})()
    metrics.update({"probs": torch.tensor([0.2, 0.9])}, batch, 1)
    assert metrics.values() == {}
    metrics.update({"probs": torch.tensor([0.2, 0.9])}, batch, EVERY)
    assert metrics.values()["accuracy"] == 1.0


def test_a_multi_task_models_towers_have_their_own():
    model = ('simple_multi_task { task_towers { tower_name: "a" label_name: "clk" '
             'train_metrics { auc {} } } task_towers { tower_name: "b" label_name: "clk" '
             'losses { l2_loss {} } train_metrics { mean_squared_error {} } } }')
    config = _config("/r", model)
    assert set(TrainMetrics(model_tasks(config.model_config, ["clk"])).metrics) == {
        "auc_a", "mean_squared_error_b"}


@pytest.mark.parametrize("metrics, error", [
    ("train_metrics { xauc {} }", "xauc is not computed on training batches.*under metrics"),
    ("train_metrics { auc {} } train_metrics { auc {} }", "lists auc more than once"),
    ("train_metrics { auc { } decay_step: 0 }", "decay_step=0; allowed: >= 1"),
    ("train_metrics { auc { } decay_rate: 1.5 }", "decay_rate=1.5; allowed: 0 to 1"),
    ("train_metrics { multiclass_auc {} }", "multiclass_auc needs a task of classes"),
])
def test_train_metrics_training_cannot_compute_are_refused(metrics, error):
    config = _config("/r", MULTI_TOWER + " " + metrics)
    feature_set = type("Features", (), {"label_fields": ["clk"], "sample_weight_fields": []})
    with pytest.raises(TrainError, match=f"model_config.train_metrics: .*{error}|{error}"):
        check_metrics(config.model_config, feature_set)


def test_model_level_train_metrics_of_a_multi_task_model_are_refused():
    from hashrec.models.errors import ModelError

    model = ('simple_multi_task { task_towers { tower_name: "a" label_name: "clk" } } '
             'train_metrics { auc {} }')
    with pytest.raises(ModelError, match="model_config.train_metrics is set on the multi-task"
                                         " model simple_multi_task; set train_metrics on"):
        model_tasks(_config("/r", model).model_config, ["clk"])


def _probe_steps(loops, first: int, last: int) -> None:
    """The same predictions and labels for ``loops``' train metrics, steps first..last."""
    gen = torch.Generator().manual_seed(first)
    for step in range(first, last + 1):
        labels = (torch.rand(16, generator=gen) < 0.4).double()
        probs = torch.rand(16, generator=gen) * 0.6 + 0.4 * labels
        batch = type("Batch", (), {"labels": {"clk": labels}})()
        for loop in loops:
            loop.train_metrics.update({"probs": probs}, batch, step)


def _resumed_loop(config, model_dir):
    session = build_session(config, device=torch.device("cpu"))
    resume = checkpoints.restore_for_training(model_dir, session.model, session.dense, True,
                                              None)
    return TrainLoop(session, LoopOptions.from_config(config), resume)


def test_a_resumed_run_continues_them_from_the_checkpoint(trained, tmp_path, caplog):
    """The checkpoint of step 10 (three folds, the window of step 10 pending) carries the
    metrics; the resumed run's values, and those after its next fold, are the
    uninterrupted run's."""
    loop, _ = trained
    config = loop.session.config
    config.model_dir = str(tmp_path)  # the session's model_dir
    loop.checkpoint_and_evaluate(evaluate=False)
    assert (tmp_path / "model.ckpt-10" / "train_metrics.pt").is_file()
    before = loop.train_metrics.values()
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        resumed = _resumed_loop(config, str(tmp_path))
    assert "train metrics continue auc, accuracy, mean_absolute_error" in caplog.text
    assert resumed.train_metrics.values() == before
    _probe_steps([loop, resumed], 11, 12)  # the fold of step 12 holds step 10's window
    assert resumed.train_metrics.values() == loop.train_metrics.values() != before


def test_a_checkpoint_without_them_restores_and_starts_them_fresh(trained, tmp_path, caplog):
    loop, _ = trained
    s = loop.session
    checkpoints.save(str(tmp_path), 10, 0, s.model, s.dense, 0)  # as checkpoints before
    assert not (tmp_path / "model.ckpt-10" / "train_metrics.pt").exists()
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        resumed = _resumed_loop(s.config, str(tmp_path))
    assert "holds no train metric state" in caplog.text and "start fresh" in caplog.text
    assert resumed.step == 10 and resumed.train_metrics.values() == {}


def test_a_changed_config_continues_the_metrics_that_match(caplog):
    saved = TrainMetrics(model_tasks(_config("/r").model_config, ["clk"]))
    _probe_steps([type("Loop", (), {"train_metrics": saved})()], 1, EVERY)
    state = saved.state_dict()
    changed = ("train_metrics { auc { thresholds: 20 } decay_step: 3 } "
               "train_metrics { accuracy {} decay_rate: 0.5 decay_step: 3 } "
               "train_metrics { mean_squared_error {} decay_step: 3 }")
    metrics = TrainMetrics(model_tasks(_config("/r", MULTI_TOWER + " " + changed).model_config,
                                       ["clk"]))
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        metrics.load_state_dict(state, where="model.ckpt-3")
    assert ("model.ckpt-3: train metrics continue accuracy; start fresh: auc (saved with "
            "thresholds 50, now 20), mean_squared_error (not in the checkpoint); the "
            "checkpoint's mean_absolute_error is not in the config, dropped") in caplog.text
    assert metrics.values() == {"accuracy": saved.values()["accuracy"]}

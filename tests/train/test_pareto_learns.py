"""An MMoE with Pareto-efficient loss weights (``use_pareto_loss_weight``) trains end to end
on generated parquet (train_and_evaluate): both tasks learn their planted signals, and the
weights it solved, shown in the progress line and written to TensorBoard, are its own (each
at least its tower's pareto_min_loss_weight, summing to 1, changing between steps), not the
towers' fixed weights, and train another model than those."""

from __future__ import annotations

import logging
import re

import numpy as np
import pyarrow as pa
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_pipeline import pipeline_text

MMOE = """mmoe { expert_mlp { hidden_units: [16, 8] } num_expert: 2
    task_towers { tower_name: "a" label_name: "clk" mlp { hidden_units: [8] }
                  pareto_min_loss_weight: 0.1 }
    task_towers { tower_name: "b" label_name: "clk2" mlp { hidden_units: [8] } weight: 0.5
                  pareto_min_loss_weight: 0.2 }
  }
  use_pareto_loss_weight: true"""
LOSSES = ("binary_cross_entropy_a", "binary_cross_entropy_b")
LEAST = (0.1, 0.2)
LINE = re.compile(r"loss weights \(binary_cross_entropy_a ([0-9.]+), "
                  r"binary_cross_entropy_b ([0-9.]+)\)")


def _table(rows: int, seed: int) -> pa.Table:
    """Two clicks of the user and the price, each decided another way."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 30, rows)
    price = rng.random(rows)
    clk = ((users % 3 + (price > 0.5)) % 3 == 0).astype(np.int64)
    clk2 = ((users % 2 == 0) ^ (price > 0.3)).astype(np.int64)
    return pa.table({"user_id": users, "price": price, "clk": clk, "clk2": clk2})


def _train(root, model: str):
    """(config, the last evaluation) of ``model`` trained 4 epochs of 20 steps on
    ``_table``'s rows, a progress line every 5 steps, with TensorBoard summaries."""
    import pyarrow.parquet as pq

    from hashrec.config import parse_pipeline_config
    from hashrec.train import train_and_evaluate

    (root / "data").mkdir(parents=True)
    pq.write_table(_table(1280, 0), root / "data" / "train.parquet")
    pq.write_table(_table(320, 1), root / "data" / "eval.parquet")
    text = pipeline_text(root, '["clk", "clk2"]', model, epochs=4).replace(
        "num_epochs: 4", "num_epochs: 4 log_step_count_steps: 5 use_tensorboard: true")
    config = parse_pipeline_config(text)
    return config, train_and_evaluate(config)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The evaluation of the same model with the towers' fixed weights."""
    return _train(tmp_path_factory.mktemp("fixed") / "run",
                  MMOE.replace("use_pareto_loss_weight: true", ""))[1]


def test_an_mmoe_trains_on_its_pareto_weights(tmp_path, caplog, fixed):
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        _, result = _train(tmp_path / "run", MMOE)
    assert min(result["auc_a"], result["auc_b"]) > 0.8  # chance: 0.5
    assert "Pareto loss weights of binary_cross_entropy_a, binary_cross_entropy_b" \
        in caplog.text

    lines = [tuple(map(float, m.groups())) for m in LINE.finditer(caplog.text)]
    assert lines  # the run's last line at least
    for weights in lines:
        assert sum(weights) == pytest.approx(1.0, abs=2e-5)
        assert all(w >= least - 1e-5 for w, least in zip(weights, LEAST))
    events = EventAccumulator(str(tmp_path / "run" / "m" / "train"))
    events.Reload()
    solved = {name: [e.value for e in events.Scalars(f"loss_weight/{name}")]
              for name in LOSSES}
    assert len(solved[LOSSES[0]]) >= 10  # a line every 5 of the 80 steps
    for a, b in zip(*solved.values()):
        assert a + b == pytest.approx(1.0, abs=1e-5) and a >= 0.1 - 1e-6 and b >= 0.2 - 1e-6
    # solved, not fixed: they change from line to line and are not the towers' weights 1 and
    # 0.5 (2/3 and 1/3 of the total weight) nor an even split
    assert max(solved[LOSSES[0]]) - min(solved[LOSSES[0]]) > 0.05
    assert not all(abs(a - 2 / 3) < 0.02 or abs(a - 0.5) < 0.02 for a in solved[LOSSES[0]])
    # and they train another model than the fixed weights
    assert result["binary_cross_entropy_a"] != pytest.approx(fixed["binary_cross_entropy_a"],
                                                             rel=1e-3)

"""param_optimizers / part_optimizers: a param group per regex_pattern, with its own
settings and schedule, over the dense optimizer's kind."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from google.protobuf import text_format
from tiny_pipeline import MULTI_TOWER, pipeline_text

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint
from hashrec.config import optimizer_pb2, parse_pipeline_config
from hashrec.train import train_and_evaluate
from hashrec.train.errors import TrainError
from hashrec.train.optimizers import build_dense_optimizer
from hashrec.train.session import build_session


def _named():
    model = torch.nn.Module()
    model.tower = torch.nn.Linear(3, 2)
    model.final = torch.nn.Linear(2, 1)
    return dict(model.named_parameters())


def _dense(text):
    return text_format.Parse(text, optimizer_pb2.DenseOptimizer())


def test_each_pattern_gets_its_own_settings_and_schedule():
    named = _named()
    dense = build_dense_optimizer(_dense("""
        adam_optimizer { lr: 0.1 beta1: 0.8 } constant_learning_rate {}
        param_optimizers {
          adam_optimizer { lr: 0.5 weight_decay: 0.01 } regex_pattern: "final\\\\..*"
          param_learning_rate { cosine_annealing_learning_rate { T_max: 4 } }
        }"""), named)
    final, rest = dense.optimizer.param_groups
    assert final["params"] == [named["final.weight"], named["final.bias"]]
    assert rest["params"] == [named["tower.weight"], named["tower.bias"]]
    assert (final["weight_decay"], *final["betas"]) == pytest.approx((0.01, 0.9, 0.999))
    assert (rest["weight_decay"], *rest["betas"]) == pytest.approx((0.0, 0.8, 0.999))
    assert dense.set_learning_rates(2, 0) == pytest.approx(0.1)
    assert (final["lr"], rest["lr"]) == pytest.approx((0.25, 0.1))


def test_without_its_own_schedule_a_pattern_follows_the_dense_optimizers():
    dense = build_dense_optimizer(_dense("""
        sgd_optimizer { lr: 1.0 } manual_step_learning_rate { schedule_sizes: [2]
          learning_rates: [0.1] }
        param_optimizers { sgd_optimizer { lr: 4.0 momentum: 0.5 } regex_pattern: "tower.*" }
        """), _named())
    dense.set_learning_rates(5, 0)
    tower, rest = dense.optimizer.param_groups
    # The dense optimizer's schedule, from the group's own lr (as TorchEasyRec builds it).
    assert (tower["lr"], tower["momentum"], rest["lr"]) == pytest.approx((0.1, 0.5, 0.1))


def test_the_older_part_optimizers_read_alike_and_the_first_match_wins():
    named = _named()
    dense = build_dense_optimizer(_dense("""
        adagrad_optimizer { lr: 0.1 }
        part_optimizers { adagrad_optimizer { lr: 0.3 } regex_pattern: ".*weight"
          linear_decay_learning_rate { total_size: 10 } }
        param_optimizers { adagrad_optimizer { lr: 0.2 } regex_pattern: "final\\\\.weight" }
        """), named)
    final, weights, rest = dense.optimizer.param_groups
    assert final["params"] == [named["final.weight"]]
    assert weights["params"] == [named["tower.weight"]]
    assert rest["params"] == [named["tower.bias"], named["final.bias"]]
    dense.set_learning_rates(5, 0)
    assert (final["lr"], weights["lr"], rest["lr"]) == pytest.approx((0.2, 0.15, 0.1))


@pytest.mark.parametrize("entry,message", [
    ('sgd_optimizer { lr: 0.1 } regex_pattern: "tower.*"',
     r"param_optimizers\[0\]: sgd_optimizer is not supported beside the dense optimizer's "
     r"adam_optimizer.*set adam_optimizer"),
    ('regex_pattern: "tower.*"', r"param_optimizers\[0\]: no optimizer"),
    ('adam_optimizer { lr: 0.1 } regex_pattern: "mlp.*"',
     r"'mlp.\*' matches no dense parameter.*tower.weight, tower.bias"),
    ('adam_optimizer { lr: 0.1 } regex_pattern: "tower("', "not a regular expression"),
], ids=["other-kind", "no-kind", "unmatched", "bad-regex"])
def test_bad_param_optimizers_are_named(entry, message):
    with pytest.raises(TrainError, match=message):
        build_dense_optimizer(_dense(f"adam_optimizer {{ lr: 0.1 }} param_optimizers {{ "
                                     f"{entry} }}"), _named())


def test_a_frozen_pattern_keeps_its_parameters_through_training(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    for name, rows in (("train", 256), ("eval", 64)):
        users = rng.integers(0, 20, rows)
        pq.write_table(pa.table({"user_id": users, "price": rng.random(rows),
                                 "y": (users % 2).astype(np.int64)}),
                       tmp_path / "data" / f"{name}.parquet")
    dense = "adam_optimizer { lr: 0.01 } constant_learning_rate {}"
    text = pipeline_text(tmp_path, '"y"', MULTI_TOWER, epochs=2)
    assert dense in text
    text = text.replace(dense, dense + ' param_optimizers { adam_optimizer { lr: 0.0 } '
                        'regex_pattern: "towers\\\\..*" }')
    config = parse_pipeline_config(text)
    torch.manual_seed(3)
    before = {n: p.detach().clone()
              for n, p in build_session(config, device=torch.device("cpu")).model
              .named_parameters() if not n.startswith("embedding.")}
    torch.manual_seed(3)
    train_and_evaluate(config)
    session = build_session(config, device=torch.device("cpu"))
    restore_checkpoint(latest_checkpoint(str(tmp_path / "m")), session.model, None,
                       session.model.embedding.dynamic_tables())
    after = dict(session.model.named_parameters())
    for name, value in before.items():
        same = torch.equal(after[name], value)
        assert same == name.startswith("towers."), name


def test_the_progress_line_shows_each_patterns_rate(tmp_path):
    """Where param_optimizers take parameters, the rates of the step name each entry beside
    the dense optimizer's own (which may train no parameter at all)."""
    dense = "adam_optimizer { lr: 0.01 } constant_learning_rate {}"
    text = pipeline_text(tmp_path, '"y"', MULTI_TOWER).replace(dense, dense + """
        param_optimizers { adam_optimizer { lr: 0.5 } regex_pattern: ".*"
          param_learning_rate { cosine_annealing_learning_rate { T_max: 4 } } }""")
    session = build_session(parse_pipeline_config(text), device=torch.device("cpu"))
    rates = session.set_learning_rates(2, 0)
    assert list(rates) == ["dense", "param_optimizers[0]", "sparse"]
    assert (rates["dense"], rates["param_optimizers[0]"]) == pytest.approx((0.01, 0.25))

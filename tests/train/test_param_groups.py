"""param_optimizers / part_optimizers: a param group per regex_pattern, with its own
settings and schedule, in a torch optimizer of the entry's kind."""

from __future__ import annotations

import math
import os

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
    final, rest = dense.param_groups
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
    tower, rest = dense.param_groups
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
    final, weights, rest = dense.param_groups
    assert final["params"] == [named["final.weight"]]
    assert weights["params"] == [named["tower.weight"]]
    assert rest["params"] == [named["tower.bias"], named["final.bias"]]
    dense.set_learning_rates(5, 0)
    assert (final["lr"], weights["lr"], rest["lr"]) == pytest.approx((0.2, 0.15, 0.1))


def test_entries_of_other_kinds_train_by_their_own_rules():
    """One torch optimizer per kind: the dense Adam over its own group and an Adam entry's,
    an SGD over an SGD entry's, each stepping as hand-built torch optimizers over the
    same parameters; the rates are set per group and listed in config order."""
    named = _named()
    dense = build_dense_optimizer(_dense("""
        adam_optimizer { lr: 0.1 } constant_learning_rate {}
        param_optimizers { sgd_optimizer { lr: 0.5 momentum: 0.9 } regex_pattern: "final.*" }
        param_optimizers { adam_optimizer { lr: 0.2 beta1: 0.5 } regex_pattern: "tower.bias"
          param_learning_rate { cosine_annealing_learning_rate { T_max: 4 } } }"""), named)
    adam, sgd = dense.optimizers
    assert (type(adam), type(sgd)) == (torch.optim.Adam, torch.optim.SGD)
    assert [g["params"] for g in dense.param_groups] == [
        [named["tower.bias"]], [named["tower.weight"]],
        [named["final.weight"], named["final.bias"]]]
    copies = {n: p.detach().clone().requires_grad_() for n, p in named.items()}
    hand = [torch.optim.Adam([copies["tower.bias"]], lr=0.2, betas=(0.5, 0.999)),
            torch.optim.Adam([copies["tower.weight"]], lr=0.1),
            torch.optim.SGD([copies["final.weight"], copies["final.bias"]], lr=0.5,
                            momentum=0.9)]
    for step in range(3):
        assert dense.set_learning_rates(step, 0) == pytest.approx(0.1)
        hand[0].param_groups[0]["lr"] = 0.1 * (1 + math.cos(math.pi * step / 4))
        for parameters in (named, copies):
            for p in parameters.values():
                p.grad = None
            x = parameters["tower.weight"] @ torch.arange(3.0) + parameters["tower.bias"]
            (parameters["final.weight"] @ x.exp() + parameters["final.bias"]).sum().backward()
        for optimizer in (*dense.optimizers, *hand):
            optimizer.step()
    for name, value in named.items():
        assert torch.allclose(value, copies[name]), name
    assert dense.entry_rates() == pytest.approx(
        {"param_optimizers[0]": 0.5, "param_optimizers[1]": 0.1 * (1 + math.cos(math.pi / 2))})
    assert list(dense.entry_rates()) == ["param_optimizers[0]", "param_optimizers[1]"]


@pytest.mark.parametrize("entry,message", [
    ('sgd_optimizer { lr: -1 } regex_pattern: "tower.*"',
     r"^train_config.dense_optimizer.param_optimizers\[0\].sgd_optimizer: Invalid learning "
     r"rate: -1"),
    ('regex_pattern: "tower.*"', r"param_optimizers\[0\]: no optimizer; set one of "
     r"sgd_optimizer, .* here \(the dense optimizer's adam_optimizer, or another kind\)"),
    ('adam_optimizer { lr: 0.1 } regex_pattern: "mlp.*"',
     r"'mlp.\*' matches no dense parameter.*tower.weight, tower.bias"),
    ('adam_optimizer { lr: 0.1 } regex_pattern: "tower("', "not a regular expression"),
], ids=["other-kind-bad-lr", "no-kind", "unmatched", "bad-regex"])
def test_bad_param_optimizers_are_named(entry, message):
    with pytest.raises(TrainError, match=message):
        build_dense_optimizer(_dense(f"adam_optimizer {{ lr: 0.1 }} param_optimizers {{ "
                                     f"{entry} }}"), _named())


def _write_data(root) -> None:
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    for name, rows in (("train", 256), ("eval", 64)):
        users = rng.integers(0, 20, rows)
        pq.write_table(pa.table({"user_id": users, "price": rng.random(rows),
                                 "y": (users % 2).astype(np.int64)}),
                       root / "data" / f"{name}.parquet")


def test_a_frozen_pattern_keeps_its_parameters_through_training(tmp_path):
    _write_data(tmp_path)
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


def _saved(path: str, name: str) -> list[torch.Tensor]:
    state = torch.load(os.path.join(path, name), weights_only=True)
    if "param_groups" in state:
        return [t for i in sorted(state["state"]) for t in state["state"][i].values()]
    return list(state.values())


def test_two_kinds_resumed_train_as_a_run_never_stopped(tmp_path):
    """The towers trained by SGD with momentum beside the dense Adam: a run stopped after 5
    of 8 steps and resumed saves the model and both optimizers' state of one never
    stopped, bit for bit."""
    _write_data(tmp_path)
    dense = "adam_optimizer { lr: 0.01 } constant_learning_rate {}"
    text = pipeline_text(tmp_path, '"y"', MULTI_TOWER, epochs=2).replace(
        dense, dense + ' param_optimizers { sgd_optimizer { lr: 0.05 momentum: 0.9 } '
        'regex_pattern: "towers\\\\..*" }')
    text = "\n".join(line for line in text.splitlines() if "eval_input_path" not in line)

    def config(name: str, steps: int):
        return parse_pipeline_config(text.replace(f"{tmp_path}/m", f"{tmp_path}/{name}")
                                     .replace("num_epochs: 2", f"num_steps: {steps}"))

    train_and_evaluate(config("straight", 8))
    train_and_evaluate(config("stopped", 5))
    train_and_evaluate(config("stopped", 8), continue_train=True)
    straight, resumed = (latest_checkpoint(str(tmp_path / n)) for n in ("straight", "stopped"))
    assert os.path.basename(resumed) == "model.ckpt-8"
    for name in ("model.pt", "optimizer.pt", "optimizer-1.pt"):
        pairs = list(zip(_saved(straight, name), _saved(resumed, name), strict=True))
        assert pairs and all(torch.equal(a, b) for a, b in pairs), name

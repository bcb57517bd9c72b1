"""A multi-task model's row loss weights per task: each tower's ``sample_weight_name``
column (unset: 1, the first sample weight field not read, as in TorchEasyRec) times its task-space factor
(``in_task_space_weight`` where ``task_space_indicator_label`` is > 0, else
``out_task_space_weight``); each task loss is its rows' weighted mean."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import DEEP_GROUP

from hashrec.models import ModelError

LABELS = ("clk", "buy")
BATCH = 8


def _config(ctr: str = "", cvr: str = "", kind: str = "mmoe") -> str:
    head = "expert_mlp { hidden_units: [8] } num_expert: 2" if kind == "mmoe" else \
        "bottom_mlp { hidden_units: [8] }"
    return f"""{DEEP_GROUP}
{kind} {{
  {head}
  task_towers {{ tower_name: "ctr" label_name: "clk" mlp {{ hidden_units: [4] }} {ctr} }}
  task_towers {{ tower_name: "cvr" label_name: "buy" mlp {{ hidden_units: [4] }} {cvr} }}
}}
"""


SPACE = 'task_space_indicator_label: "clk" out_task_space_weight: 0'
FOCAL_LOSSES = "losses { binary_cross_entropy {} } losses { binary_focal_loss { gamma: 1 } }"


def _batch(**weights) -> object:
    batch = make_batch(BATCH, seed=3, more_labels=("buy",))
    batch.labels["clk"] = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    for name, values in weights.items():
        batch.labels[name] = torch.tensor(values)
    return batch


def _bce(out, batch, task: str, label: str) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(
        out[f"logits_{task}"], batch.labels[label], reduction="none")


def _weighted_mean(each: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (each * w).sum() / w.sum()


@pytest.mark.parametrize("kind", ["mmoe", "dbmtl"])
def test_a_task_space_task_trains_on_its_space_only(kind):
    model = fake_model(_config(cvr=SPACE, kind=kind), labels=LABELS)
    batch = _batch()
    out = model(batch)
    losses = model.loss(out, batch)
    clk = batch.labels["clk"]
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"],
                               _bce(out, batch, "ctr", "clk").mean())
    torch.testing.assert_close(losses["binary_cross_entropy_cvr"],
                               _weighted_mean(_bce(out, batch, "cvr", "buy"), clk))
    assert model.sample_weights(batch).tolist() == [[1.0, c] for c in clk.tolist()]

    def cvr_gradients(labels: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        flipped = _batch()
        flipped.labels["buy"] = labels
        model.loss(model(flipped), flipped)["binary_cross_entropy_cvr"].backward()
        return [p.grad.clone() for n, p in model.named_parameters()
                if p.grad is not None and not n.startswith("embedding")]

    buy = batch.labels["buy"]
    before = cvr_gradients(buy)
    # Rows out of the space (no click) contribute nothing, whatever their label ...
    after = cvr_gradients(torch.where(clk > 0, buy, 1 - buy))
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    # ... and those in it do.
    changed = cvr_gradients(torch.where(clk > 0, 1 - buy, buy))
    assert not all(torch.allclose(a, b) for a, b in zip(before, changed))


def test_in_and_out_factors_multiply_the_sample_weight():
    cvr = ('sample_weight_name: "w" task_space_indicator_label: "clk" '
           'in_task_space_weight: 3 out_task_space_weight: 0.5')
    model = fake_model(_config(ctr='sample_weight_name: "w"', cvr=cvr), labels=LABELS,
                       weights=("w",))
    w = [1.0, 2.0, 0.0, 1.0, 4.0, 0.5, 1.0, 2.0]
    batch = _batch(w=w)
    out = model(batch)
    losses = model.loss(out, batch)
    space = torch.where(batch.labels["clk"] > 0, 3.0, 0.5)
    row = torch.tensor(w)
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"],
                               _weighted_mean(_bce(out, batch, "ctr", "clk"), row))
    torch.testing.assert_close(losses["binary_cross_entropy_cvr"],
                               _weighted_mean(_bce(out, batch, "cvr", "buy"), row * space))


def test_each_task_reads_its_own_sample_weight_column():
    model = fake_model(_config(ctr='sample_weight_name: "v"', cvr='sample_weight_name: "w"'),
                       labels=LABELS, weights=("w", "v"))
    w = [1.0, 0.0, 2.0, 1.0, 3.0, 0.5, 0.0, 1.0]
    v = [0.0, 5.0, 1.0, 1.0, 0.0, 2.0, 1.0, 0.0]
    batch = _batch(w=w, v=v)
    out = model(batch)
    losses = model.loss(out, batch)
    torch.testing.assert_close(losses["binary_cross_entropy_ctr"],
                               _weighted_mean(_bce(out, batch, "ctr", "clk"), torch.tensor(v)))
    torch.testing.assert_close(losses["binary_cross_entropy_cvr"],
                               _weighted_mean(_bce(out, batch, "cvr", "buy"), torch.tensor(w)))
    # A tower without sample_weight_name weighs its rows 1 (TorchEasyRec's
    # MultiTaskRank): the first sample weight field is the single-task models' only.
    default = fake_model(_config(ctr='sample_weight_name: "v"'), labels=LABELS,
                         weights=("w", "v"))
    assert [t.sample_weight_name for t in default.tasks] == ["v", ""]
    assert torch.equal(default.sample_weights(batch), torch.tensor([v, [1.0] * len(w)]).T)
    out = default(batch)
    torch.testing.assert_close(default.loss(out, batch)["binary_cross_entropy_cvr"],
                               _bce(out, batch, "cvr", "buy").mean())


def test_unweighted_towers_give_no_weights():
    model = fake_model(_config(), labels=LABELS)
    assert not model.weighted and model.sample_weights(_batch()) is None
    _, *targets = model.targets(_batch())
    assert targets == []


def test_all_weights_zero_gives_a_zero_loss():
    model = fake_model(_config(cvr=SPACE), labels=LABELS)
    batch = _batch()
    batch.labels["clk"] = torch.zeros(BATCH)
    losses = model.loss(model(batch), batch)
    assert float(losses["binary_cross_entropy_cvr"].detach()) == 0.0


def test_the_own_label_may_mark_the_space():
    model = fake_model(_config(cvr='task_space_indicator_label: "buy"'), labels=LABELS)
    assert model.tasks[1].task_space_label == "buy"


@pytest.mark.parametrize("cvr, message", [
    ('sample_weight_name: "v"', r"task_towers\['cvr'\].sample_weight_name 'v' is not one of "
                                r"data_config.sample_weight_fields \(w\)"),
    ('task_space_indicator_label: "pay"',
     r"task_towers\['cvr'\].task_space_indicator_label 'pay' is not one of "
     r"data_config.label_fields \(clk, buy\)"),
    ("in_task_space_weight: -1", r"in_task_space_weight=-1.0; a row loss weight's factor must "
                                 r"be a finite number >= 0"),
    ("out_task_space_weight: nan", r"out_task_space_weight=nan"),
], ids=["unknown-weight", "unknown-space-label", "negative-in", "nan-out"])
def test_bad_task_weighting_is_refused(cvr, message):
    with pytest.raises(ModelError, match=message):
        fake_model(_config(cvr=cvr), labels=LABELS, weights=("w",))


def test_sample_weight_name_without_weight_fields_is_refused():
    with pytest.raises(ModelError, match=r"sample_weight_fields \(none\); add it there"):
        fake_model(_config(cvr='sample_weight_name: "w"'), labels=LABELS)


@pytest.mark.parametrize("cvr", [SPACE, f"{SPACE} {FOCAL_LOSSES}"], ids=["one-loss",
                                                                       "two-losses"])
def test_the_graph_module_takes_the_weights_as_targets(cvr):
    """``hashrec.train.graphs`` runs the loss on (labels, weights), (B, tasks) each: the
    same task losses as the eager loss (a task of two losses: both)."""
    from hashrec.train.graphs import _DenseLoss

    model = fake_model(_config(ctr='sample_weight_name: "w"', cvr=cvr), labels=LABELS,
                       weights=("w",))
    batch = _batch(w=[1.0, 0.0, 2.0, 1.0, 3.0, 0.5, 0.0, 1.0])
    labels, weights = model.targets(batch)
    assert labels.shape == weights.shape == (BATCH, 2)
    inputs = model.dense_inputs(model.embed(batch), batch)
    _, losses = _DenseLoss(model)(*inputs, labels, weights)
    eager = model.loss(model(batch), batch)
    torch.testing.assert_close(losses, torch.stack(list(eager.values())))


def test_a_single_task_model_with_two_labels_says_which_it_trains_on(caplog):
    from hashrec.config import parse_pipeline_config
    from hashrec.models.tasks import model_tasks

    config = parse_pipeline_config(f'model_dir: "m" model_config {{ {DEEP_GROUP} '
                                   f'multi_tower {{ towers {{ input: "all" mlp {{ '
                                   f'hidden_units: [4] }} }} }} }}').model_config
    with caplog.at_level("WARNING", logger="hashrec.models"):
        (task,) = model_tasks(config, ["buy", "clk"])
    assert task.label_name == "buy"
    assert "trains on the first, 'buy'" in caplog.text
    caplog.clear()
    model_tasks(config, ["clk"])
    assert not caplog.text


@pytest.mark.parametrize("losses, message", [
    ("losses {}", r"model_config.losses: a loss config sets no loss; set one of "
                  r"binary_cross_entropy, binary_focal_loss, softmax_cross_entropy, "
                  r"jrc_loss, l2_loss"),
], ids=["empty"])
def test_a_loss_kind_not_supported_is_named(losses, message):
    from hashrec.config import parse_pipeline_config
    from hashrec.models.tasks import model_tasks

    config = parse_pipeline_config(f'model_dir: "m" model_config {{ {DEEP_GROUP} '
                                   f'multi_tower {{ towers {{ input: "all" mlp {{ '
                                   f'hidden_units: [4] }} }} }} {losses} }}').model_config
    with pytest.raises(ModelError, match=message):
        model_tasks(config, ["clk"])


def _focal(out, batch, task: str, label: str) -> torch.Tensor:
    from hashrec.models.losses import binary_focal_rows

    return binary_focal_rows(out[f"logits_{task}"], batch.labels[label], 1.0, 0.5)


def test_a_task_of_several_losses_trains_on_each_times_its_weight():
    # TorchEasyRec sums a tower's losses, each times the tower's weight, under its key.
    cvr = f"{FOCAL_LOSSES} weight: 2 {SPACE}"
    model = fake_model(_config(cvr=cvr), labels=LABELS)
    assert model.losses == ("binary_cross_entropy_ctr", "binary_cross_entropy_cvr",
                            "binary_focal_loss_cvr")
    batch = _batch()
    out = model(batch)
    losses = model.loss(out, batch)
    clk = batch.labels["clk"]
    torch.testing.assert_close(losses["binary_cross_entropy_cvr"],
                               2 * _weighted_mean(_bce(out, batch, "cvr", "buy"), clk))
    torch.testing.assert_close(losses["binary_focal_loss_cvr"],
                               2 * _weighted_mean(_focal(out, batch, "cvr", "buy"), clk))
    # a column of row weights per loss, for the evaluation's means and the ranks' scale
    weights = model.target_weights(model.targets(batch))
    assert weights.tolist() == [[1.0, c, c] for c in clk.tolist()]
    assert set(out) == {"logits_ctr", "probs_ctr", "logits_cvr", "probs_cvr"}


def test_a_single_task_model_of_several_losses_reports_each():
    model = fake_model(f"{DEEP_GROUP} multi_tower {{ towers {{ input: \"all\" mlp {{ "
                       f"hidden_units: [4] }} }} }} {FOCAL_LOSSES}")
    assert model.losses == ("binary_cross_entropy", "binary_focal_loss")
    batch = _batch()
    out = model(batch)
    losses = model.loss(out, batch)
    logits, clk = out["logits"], batch.labels["clk"]
    torch.testing.assert_close(
        losses["binary_cross_entropy"],
        torch.nn.functional.binary_cross_entropy_with_logits(logits, clk))
    from hashrec.models.losses import binary_focal_rows

    torch.testing.assert_close(losses["binary_focal_loss"],
                               binary_focal_rows(logits, clk, 1.0, 0.5).mean())


@pytest.mark.parametrize("losses, message", [
    ("losses { binary_cross_entropy {} } losses { l2_loss {} }",
     r"binary_cross_entropy and l2_loss together; the losses of a task must make one "
     r"prediction"),
    ("losses { binary_cross_entropy {} } losses { binary_cross_entropy {} }",
     r"binary_cross_entropy listed twice"),
    ("num_class: 2 losses { softmax_cross_entropy {} } losses { binary_focal_loss {} }",
     r"softmax_cross_entropy and binary_focal_loss together"),
], ids=["binary-and-l2", "twice", "classes-and-binary"])
def test_losses_of_different_predictions_or_a_kind_twice_are_refused(losses, message):
    with pytest.raises(ModelError, match=r"mmoe.task_towers\['cvr'\].losses: " + message):
        fake_model(_config(cvr=losses), labels=LABELS)


def test_a_tower_past_the_label_fields_without_label_name_is_told_to_set_one():
    # DBMTL reads the label field of a tower's position where label_name is unset.
    from hashrec.config import parse_pipeline_config
    from hashrec.models.tasks import model_tasks

    towers = "".join(f'task_towers {{ tower_name: "{name}" }} ' for name in ("a", "b", "c"))
    config = parse_pipeline_config(f'model_dir: "m" model_config {{ {DEEP_GROUP} dbmtl {{ '
                                   f'bottom_mlp {{ hidden_units: [4] }} {towers} }} }}')
    with pytest.raises(ModelError, match=r"^dbmtl.task_towers\['c'\] has no label_name, and "
                                         r"data_config.label_fields has no field at its "
                                         r"position 2 \(it lists clk, buy\): set label_name$"):
        model_tasks(config.model_config, ["clk", "buy"])


PARETO = "use_pareto_loss_weight: true"


@pytest.mark.parametrize("kind", ["mmoe", "dbmtl"])
def test_pareto_least_weights_are_each_losss_towers(kind):
    # a tower of two losses gives each its least weight (TaskTower, BayesTaskTower)
    towers = {"ctr": "pareto_min_loss_weight: 0.2",
              "cvr": f"pareto_min_loss_weight: 0.1 {FOCAL_LOSSES}"}
    model = fake_model(_config(**towers, kind=kind) + PARETO, labels=LABELS)
    assert model.losses == ("binary_cross_entropy_ctr", "binary_cross_entropy_cvr",
                            "binary_focal_loss_cvr")
    assert model.pareto_min_weights == (0.2, 0.1, 0.1)
    assert fake_model(_config(kind=kind) + PARETO, labels=LABELS).pareto_min_weights == \
        (0.0, 0.0)


@pytest.mark.parametrize("ctr, cvr, message", [
    ("pareto_min_loss_weight: 1", "", r"mmoe.task_towers\['ctr'\].pareto_min_loss_weight="
                                      r"1.0; the least Pareto loss weight must be a number "
                                      r"in \[0, 1\)"),
    ("", "pareto_min_loss_weight: -0.1", r"task_towers\['cvr'\].pareto_min_loss_weight=-0.1"),
    ("pareto_min_loss_weight: 0.5", f"pareto_min_loss_weight: 0.3 {FOCAL_LOSSES}",
     r"mmoe.task_towers: pareto_min_loss_weight sums to 1.1 over the towers' losses \(ctr "
     r"0.5 x 1, cvr 0.3 x 2\); the least weights of model_config.use_pareto_loss_weight "
     r"must sum to below 1"),
    ("pareto_min_loss_weight: 0.5", "pareto_min_loss_weight: 0.5", r"sums to 1 over"),
], ids=["one", "negative", "sum-over-losses", "sum-one"])
def test_bad_pareto_least_weights_are_refused(ctr, cvr, message):
    with pytest.raises(ModelError, match=message):
        fake_model(_config(ctr=ctr, cvr=cvr) + PARETO, labels=LABELS)


@pytest.mark.parametrize("model", [
    'multi_tower { towers { input: "all" mlp { hidden_units: [4] } } }',
    'dssm { user_tower { input: "all" mlp { hidden_units: [4] } } '
    'item_tower { input: "all" mlp { hidden_units: [4] } } output_dim: 4 }',
], ids=["multi-tower", "dssm"])
def test_pareto_loss_weights_on_a_single_task_model_are_refused(model):
    from hashrec.config import parse_pipeline_config
    from hashrec.models.tasks import model_tasks

    config = parse_pipeline_config(f'model_dir: "m" model_config {{ {DEEP_GROUP} {model} '
                                   f'{PARETO} }}').model_config
    kind = model.split()[0]
    with pytest.raises(ModelError, match=rf"model_config.use_pareto_loss_weight: true is set "
                                         rf"on the single-task model {kind}; .*remove it"):
        model_tasks(config, ["clk"])


def test_least_weights_without_pareto_weights_are_warned_of(caplog):
    with caplog.at_level("WARNING", logger="hashrec.models"):
        model = fake_model(_config(cvr="pareto_min_loss_weight: 0.2"), labels=LABELS)
    assert model.pareto_min_weights is None
    assert ("mmoe.task_towers['cvr']: pareto_min_loss_weight is not used: "
            "model_config.use_pareto_loss_weight is false") in caplog.text

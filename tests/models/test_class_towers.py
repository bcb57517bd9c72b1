"""Task towers of classes: a tower's ``num_class`` logits (softmax_cross_entropy, jrc_loss
with two) beside one-logit towers in MMoE, DBMTL and PLE, each task's outputs and loss
from its own columns of the logits; DBMTL relations read a classes tower's hidden output
(as TorchEasyRec's); jrc_loss reads its sessions from the named feature; wrong
num_class and loss pairs are refused."""

from __future__ import annotations

import pytest
import torch
from model_fakes import fake_model, make_batch
from multi_task_checks import DEEP_GROUP

from hashrec.models import ModelError
from hashrec.models.losses import LossSpec, loss_rows

LABELS = ("clk", "lvl", "buy")
BATCH = 8
TOWERS = """
    task_towers { tower_name: "ctr" label_name: "clk" mlp { hidden_units: [4] } }
    task_towers { tower_name: "level" label_name: "lvl" mlp { hidden_units: [4] } num_class: 3
                  losses { softmax_cross_entropy { label_smoothing: 0.2 } } weight: 0.5 }
    task_towers { tower_name: "jrc" label_name: "buy" mlp { hidden_units: [4] } num_class: 2
                  losses { jrc_loss { session_name: "user_id" alpha: 0.3 } } }"""
HEADS = {
    "mmoe": "expert_mlp { hidden_units: [8] } num_expert: 2",
    "dbmtl": "bottom_mlp { hidden_units: [8] }",
    "ple": "extraction_networks { network_name: 'l1' expert_num_per_task: 1 share_num: 1 "
           "task_expert_net { hidden_units: [8] } share_expert_net { hidden_units: [8] } }",
}


def _model(kind: str, towers: str = TOWERS):
    return fake_model(f"{DEEP_GROUP}\n{kind} {{ {HEADS[kind]} {towers} }}", labels=LABELS)


def _batch():
    batch = make_batch(BATCH, seed=4, more_labels=("buy",))
    batch.labels["lvl"] = torch.tensor([0.0, 2.0, 1.0, 1.0, 0.0, 2.0, 2.0, 1.0])
    return batch


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_each_task_gets_its_columns_outputs_and_loss(kind):
    model = _model(kind)
    batch = _batch()
    out = model(batch)
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "logits_ctr": (BATCH,), "probs_ctr": (BATCH,), "logits_level": (BATCH, 3),
        "probs_level": (BATCH, 3), "logits_jrc": (BATCH, 2), "probs_jrc": (BATCH, 2),
        "probs1_jrc": (BATCH,)}
    logits = model.dense_forward(model.embed(batch), batch)
    assert logits.shape == (BATCH, 1 + 3 + 2)
    torch.testing.assert_close(out["logits_level"], logits[:, 1:4])
    torch.testing.assert_close(out["probs_level"], torch.softmax(logits[:, 1:4], -1))
    torch.testing.assert_close(out["probs1_jrc"], torch.softmax(logits[:, 4:], -1)[:, 1])
    losses = model.loss(out, batch)
    assert list(losses) == ["binary_cross_entropy_ctr", "softmax_cross_entropy_level",
                            "jrc_loss_jrc"]
    level = torch.nn.functional.cross_entropy(out["logits_level"], batch.labels["lvl"].long(),
                                              label_smoothing=0.2)
    torch.testing.assert_close(losses["softmax_cross_entropy_level"], 0.5 * level)
    users = batch.sparse["user_id"].values
    jrc = loss_rows(LossSpec("jrc_loss", alpha=0.3, session_name="user_id"),
                    out["logits_jrc"], batch.labels["buy"], users).mean()
    torch.testing.assert_close(losses["jrc_loss_jrc"], jrc)
    sum(losses.values()).backward()
    assert all(p.grad is not None for n, p in model.named_parameters()
               if not n.startswith("embedding"))


def test_jrc_sessions_are_the_first_id_of_the_named_feature():
    model = _model("mmoe")
    batch = _batch()
    labels, sessions = model.targets(batch)
    assert labels.shape == (BATCH, 3) and sessions.dtype == torch.int64
    torch.testing.assert_close(sessions[:, 0], batch.sparse["user_id"].values)
    assert model.session_names == ("user_id",)


def test_the_graph_module_takes_the_sessions_as_targets():
    """``hashrec.train.graphs`` runs the loss on (labels, sessions): the eager losses."""
    from hashrec.train.graphs import _DenseLoss

    model = _model("dbmtl")
    batch = _batch()
    inputs = model.dense_inputs(model.embed(batch), batch)
    _, losses = _DenseLoss(model)(*inputs, *model.targets(batch))
    torch.testing.assert_close(losses, torch.stack(list(model.loss(model(batch), batch)
                                                        .values())))


def test_a_dbmtl_tower_reads_a_classes_tower_through_its_relation():
    towers = TOWERS.replace(
        'task_towers { tower_name: "jrc" label_name: "buy" mlp { hidden_units: [4] }',
        'task_towers { tower_name: "jrc" label_name: "buy" mlp { hidden_units: [4] } '
        'relation_tower_names: "level" relation_mlp { hidden_units: [5] }')
    model = _model("dbmtl", towers)
    jrc = model.net.tasks["jrc"]
    # The relation reads the level tower's hidden output (4 wide), not its 3 logits.
    assert jrc.relation.first_weight().shape[1] == 4 + 4 and jrc.logit.out_features == 2
    batch = _batch()
    with torch.no_grad():
        before = model(batch)["logits_jrc"]
        model.net.tasks["level"].task_input.tower.first_bias().add_(1.0)
        after = model(batch)["logits_jrc"]
    assert not torch.allclose(before, after)  # the level tower feeds the jrc tower


def test_a_single_task_model_of_two_classes_gives_probs1():
    model = fake_model(f"{DEEP_GROUP}\nmulti_tower {{ towers {{ input: 'all' mlp {{ "
                       f"hidden_units: [4] }} }} }} num_class: 2 losses {{ "
                       f"softmax_cross_entropy {{}} }}")
    out = model(make_batch(BATCH))
    assert set(out) == {"logits", "probs", "probs1"} and out["logits"].shape == (BATCH, 2)
    torch.testing.assert_close(out["probs1"], out["probs"][:, 1])


@pytest.mark.parametrize("tower, message", [
    ("num_class: 3", r"task_towers\['t'\].num_class=3 with binary_cross_entropy, which "
                     r"trains one logit \(a label in \[0, 1\]\): set num_class 1; for several "
                     r"classes use softmax_cross_entropy"),
    ("losses { softmax_cross_entropy {} }",
     r"num_class=1 with softmax_cross_entropy; softmax_cross_entropy needs num_class 2 or "
     r"more"),
    ("num_class: 3 losses { jrc_loss { session_name: 'user_id' } }",
     r"num_class=3 with jrc_loss; jrc_loss needs num_class 2 \(two classes\)"),
    ("num_class: 2 losses { l2_loss {} }", r"num_class=2 with l2_loss, which trains one "
                                           r"value a row: set num_class 1"),
    ("losses { binary_focal_loss { alpha: 0 } }",
     r"task_towers\['t'\].losses.binary_focal_loss: alpha=0.0; allowed: a number in "
     r"\(0, 1\)"),
    ("num_class: 2 losses { jrc_loss { session_name: '' } }", r"session_name is empty"),
    # a float field holds float32: the message names the -0.1 written, not -0.100000001
    ("num_class: 3 losses { softmax_cross_entropy { label_smoothing: -0.1 } }",
     r"softmax_cross_entropy: label_smoothing=-0.1; allowed: a number in \[0, 1\]$"),
    ("task_space_indicator_label: 'clk' out_task_space_weight: -0.1",
     r"out_task_space_weight=-0.1; a row loss weight's factor must be a finite number"),
], ids=["bce-3", "softmax-1", "jrc-3", "l2-2", "focal-alpha", "jrc-no-session",
        "smoothing-float32", "task-space-float32"])
def test_loss_and_num_class_that_do_not_fit_are_refused(tower, message):
    with pytest.raises(ModelError, match=message):
        _model("mmoe", f'task_towers {{ tower_name: "t" label_name: "clk" {tower} }}')


def test_model_level_num_class_of_a_multi_task_model_points_at_the_towers():
    with pytest.raises(ModelError, match=r"model_config.num_class=3 is set on the multi-task "
                                         r"model mmoe; set num_class on each of "
                                         r"mmoe.task_towers instead"):
        fake_model(f"{DEEP_GROUP}\nmmoe {{ {HEADS['mmoe']} {TOWERS} }} num_class: 3",
                   labels=LABELS)


def test_a_missing_session_feature_is_named():
    model = _model("mmoe", TOWERS.replace('session_name: "user_id"', 'session_name: "sid"'))
    with pytest.raises(ModelError, match=r"jrc_loss session_name 'sid' is not a feature of "
                                         r"the batch"):
        model.targets(_batch())

import pytest
import torch
from model_fakes import WIDE_DIM, fake_model, make_batch, train_one_batch

from hashrec.models import ModelError, WideAndDeep

WIDE = ("user_id", "item_id", "cate_id")
CONFIG = """
feature_groups { group_name: "wide" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: WIDE }
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
wide_and_deep {
  deep { hidden_units: [8, 4] }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""
NO_FINAL = CONFIG.replace("final { hidden_units: [4] }", "")


def _model(text=CONFIG):
    return fake_model(text, WIDE)


def test_registry_builds_wide_and_deep_from_the_groups():
    model = _model()
    assert type(model) is WideAndDeep
    assert [f.name for f in model.wide_group.features] == [f"{n}@wide" for n in WIDE]
    assert model.wide_group.dim == 3 * WIDE_DIM
    assert [f.name for f in model.deep_group.features] == ["user_id", "price", "item_id",
                                                           "cate_id"]
    assert model.net.deep.first_weight().shape[1] == 4 + 1 + 4 + 4
    assert model.net.final.output_dim() == 4 and model.net.output.in_features == 4


def test_forward_backward_and_loss():
    model = _model()
    train_one_batch(model)
    tables = model.embedding.tables
    assert tables["user_id_wide"].weight.grad.abs().sum() > 0
    assert tables["user_id"].weight.grad.abs().sum() > 0  # the DEEP copy trains apart


def test_without_final_the_wide_logit_adds_to_the_deep_logit():
    model = _model(NO_FINAL)
    model.eval()
    batch = make_batch(5)
    embedded = model.embedding(batch.sparse)
    wide = sum(embedded.pooled[f"{n}@wide"].sum(-1) for n in WIDE)
    deep = torch.cat([embedded.pooled["user_id"], batch.dense["price"],
                      embedded.pooled["item_id"], embedded.pooled["cate_id"]], dim=-1)
    expected = wide + model.net.output(model.net.deep(deep)).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    assert model.net.output.in_features == 4


def test_with_final_the_wide_logit_is_a_final_input():
    model = _model()
    model.eval()
    batch = make_batch(5)
    wide, deep = model.dense_inputs(model.embedding(batch.sparse), batch)
    hidden = torch.cat([wide.sum(-1, keepdim=True), model.net.deep(deep)], dim=-1)
    expected = model.net.output(model.net.final(hidden)).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    assert model.net.final.first_weight().shape[1] == 1 + 4


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace('group_type: WIDE', 'group_type: DEEP'),
     "wide_and_deep needs a WIDE feature group"),
    ("\n".join(line for line in CONFIG.splitlines() if "group_type: DEEP" not in line),
     "wide_and_deep needs a DEEP feature group"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "feature group 'seq' is SEQUENCE; wide_and_deep reads"),
    (CONFIG.replace('"item_id", "cate_id"]\n                 group_type: WIDE',
                    '"item_id", "price"]\n                 group_type: WIDE'),
     "WIDE feature group 'wide': feature 'price' is a raw feature without boundaries"),
    (CONFIG.replace('"item_id", "cate_id"]\n                 group_type: WIDE',
                    '"item_id", "click_seq__item_id"]\n                 group_type: WIDE'),
     "feature 'click_seq__item_id' is a sequence feature"),
    (CONFIG.replace('"item_id", "cate_id"]\n                 group_type: WIDE',
                    '"item_id", "ghost"]\n                 group_type: WIDE'),
     r"feature 'ghost' is not defined in feature_configs \(known: cate_id, "),
    (CONFIG.replace("deep { hidden_units: [8, 4] }", "deep { hidden_units: [] }"),
     "wide_and_deep.deep"),
    (CONFIG.replace("final { hidden_units: [4] }", "final { dropout_ratio: [2] }"),
     "wide_and_deep.final"),
], ids=["no-wide", "no-deep", "sequence-group", "raw-in-wide", "sequence-in-wide",
        "unknown-in-wide", "bad-deep", "bad-final"])
def test_config_errors_name_the_field(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)

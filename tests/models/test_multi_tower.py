import pytest
import torch
from model_fakes import (
    FakeEmbedding,
    FakeFeatureSet,
    fake_model,
    make_batch,
    model_config,
    train_one_batch,
)

from hashrec.models import ModelError, MultiTower, MultiTowerDIN

CONFIG = """
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
multi_tower {
  towers { input: "user" mlp { hidden_units: [8, 4] } }
  towers { input: "item" mlp { hidden_units: [6] } }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""


def _model(text=CONFIG):
    return fake_model(text)


def test_registry_builds_multi_tower():
    model = _model()
    assert type(model) is MultiTower
    assert list(model.towers) == ["user", "item"]
    assert model.groups["user"].dim == 4 + 1 and model.groups["item"].dim == 8
    assert model.final.output_dim() == 4 and model.output.in_features == 4


def test_forward_backward_and_loss():
    model = _model()
    train_one_batch(model)
    assert model.embedding.tables["cate_id"].weight.grad.abs().sum() > 0
    assert model.embedding.tables["click_seq__item_id"].weight.grad is None


def test_without_final_the_towers_feed_the_output():
    model = _model(CONFIG.replace("final { hidden_units: [4] }", ""))
    assert model.final is None and model.output.in_features == 4 + 6
    assert model(make_batch(3))["logits"].shape == (3,)


def test_equals_multi_tower_din_without_din_towers():
    tower = _model()
    din = MultiTowerDIN(model_config(CONFIG.replace("multi_tower {", "multi_tower_din {")),
                        FakeFeatureSet(), None, embedding=FakeEmbedding())
    din.load_state_dict(tower.state_dict())
    tower.eval()
    din.eval()
    batch = make_batch(5)
    assert torch.equal(tower(batch)["logits"], din(batch)["logits"])


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace('input: "item"', 'input: "nope"'), "nope"),
    (CONFIG.replace('input: "item"', 'input: "user"'), "'user' feeds two towers"),
    (CONFIG.replace('towers { input: "item" mlp { hidden_units: [6] } }', ""),
     r"\['item'\] feed no tower .*towers \(DEEP\) entry"),
    (CONFIG.split("multi_tower {")[0] + "multi_tower { }", "multi_tower has no towers"),
    (CONFIG.replace("hidden_units: [6]", "hidden_units: [6] use_bn: true use_ln: true"),
     r"multi_tower.towers\['item'\].mlp"),
    (CONFIG.replace("final { hidden_units: [4] }", "final { hidden_units: [] }"),
     "multi_tower.final"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG.replace('input: "item"', 'input: "seq"'),
     "'seq' is SEQUENCE, expected DEEP"),
], ids=["unknown-group", "two-towers", "group-without-tower", "no-towers", "bad-mlp",
        "bad-final", "sequence-group"])
def test_config_errors_name_the_field(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)

import pytest
import torch
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import DeepFM, ModelError
from hashrec.modules import FactorizationMachine

WIDE = ("user_id", "cate_id")
CONFIG = """
feature_groups { group_name: "wide" feature_names: ["user_id", "cate_id"] group_type: WIDE }
feature_groups { group_name: "deep" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
deepfm {
  deep { hidden_units: [8, 4] }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""
NO_FINAL = CONFIG.replace("final { hidden_units: [4] }", "")
# The FM pairs the group "fm"; the deep MLP reads "deep", which has a raw feature.
FM_GROUP = CONFIG.replace('"cate_id"]\n                 group_type: DEEP }', '''"price"]
                 group_type: DEEP }
feature_groups { group_name: "fm" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }''')


def _model(text=CONFIG):
    return fake_model(text, WIDE)


def _pooled(embedded, names):
    return torch.stack([embedded.pooled[n] for n in names], dim=1)


def test_registry_builds_deepfm_pairing_the_deep_features():
    model = _model()
    assert type(model) is DeepFM and model.fm_group is None
    assert model.net.fm_features == 3
    assert model.net.final.first_weight().shape[1] == 1 + DIM + 4


def test_forward_backward_and_loss():
    model = _model(FM_GROUP)
    train_one_batch(model)
    tables = model.embedding.tables
    assert tables["user_id_wide"].weight.grad.abs().sum() > 0
    assert tables["item_id"].weight.grad.abs().sum() > 0


def test_without_final_the_logit_adds_wide_fm_and_deep():
    model = _model(NO_FINAL)
    model.eval()
    batch = make_batch(5)
    embedded = model.embedding(batch.sparse)
    features = _pooled(embedded, ["user_id", "item_id", "cate_id"])
    wide = sum(embedded.pooled[f"{n}@wide"].sum(-1) for n in WIDE)
    fm = FactorizationMachine()(features).sum(-1)
    deep = model.net.output(model.net.deep(features.flatten(1))).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], wide + fm + deep)


def test_the_fm_group_feeds_only_the_factorization_machine():
    model = _model(FM_GROUP)
    model.eval()
    assert [f.name for f in model.deep_group.features] == ["user_id", "item_id", "price"]
    assert model.net.deep.first_weight().shape[1] == 2 * DIM + 1
    batch = make_batch(4)
    embedded = model.embedding(batch.sparse)
    wide, deep, fm = model.dense_inputs(embedded, batch)
    torch.testing.assert_close(fm, _pooled(embedded, ["user_id", "item_id", "cate_id"])
                               .flatten(1))
    hidden = torch.cat([wide.sum(-1, keepdim=True),
                        FactorizationMachine()(fm.view(4, 3, DIM)), model.net.deep(deep)], -1)
    expected = model.net.output(model.net.final(hidden)).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace('"cate_id"]\n                 group_type: DEEP', '"price"]\n'
                    '                 group_type: DEEP'),
     r"reads the DEEP groups \(no DEEP group named 'fm'\), whose features have widths "
     r"user_id 4, item_id 4, price 1"),
    (FM_GROUP.replace('"item_id", "cate_id"]\n                 group_type: DEEP }',
                      '"price"]\n                 group_type: DEEP }'),
     "reads feature group 'fm', whose features have widths user_id 4, price 1"),
    (CONFIG.replace("deep { hidden_units: [8, 4] }", "deep { hidden_units: [0] }"),
     "deepfm.deep"),
    ("\n".join(line for line in CONFIG.splitlines() if "WIDE" not in line),
     "deepfm needs a WIDE feature group"),
], ids=["deep-widths", "fm-group-widths", "bad-deep", "no-wide"])
def test_config_errors_name_the_field(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)

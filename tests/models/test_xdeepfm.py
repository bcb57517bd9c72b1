"""xDeepFM on the fakes: the CIN reads the WIDE groups' embeddings in order, the deep MLP
the DEEP groups; config errors name the group or field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import WIDE_DIM, fake_model, make_batch, train_one_batch

from hashrec.models import ModelError, XDeepFM

WIDE = ("user_id", "item_id", "cate_id")
CONFIG = """
feature_groups { group_name: "wide" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: WIDE }
feature_groups { group_name: "deep" feature_names: ["user_id", "item_id", "price"]
                 group_type: DEEP }
xdeepfm {
  cin { cin_layer_size: [4, 2] }
  deep { hidden_units: [8, 4] }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""


def _model(text=CONFIG):
    return fake_model(text, WIDE)


def _cin_by_loops(cin, x: torch.Tensor) -> torch.Tensor:
    """X^k[h] = sum_{i, j} W[h, i, j] X^{k-1}[i] * X^0[j] + c[h], each summed over the
    columns."""
    hidden, outputs = x, []
    for layer in cin.layers:
        weight = layer.weight.reshape(layer.out_features, hidden.shape[1], x.shape[1])
        nxt = torch.einsum("hij,bie,bje->bhe", weight, hidden, x) + layer.bias[:, None]
        outputs.append(nxt.sum(-1))
        hidden = nxt
    return torch.cat(outputs, dim=-1)


def test_logits_follow_the_cin_and_the_deep_mlp():
    model = _model()
    assert type(model) is XDeepFM
    model.eval()
    batch = make_batch(5)
    embedded = model.embedding(batch.sparse)
    wide = torch.stack([embedded.pooled[f"{n}@wide"] for n in WIDE], dim=1)
    assert wide.shape == (5, 3, WIDE_DIM)
    deep = torch.cat([embedded.pooled["user_id"], embedded.pooled["item_id"],
                      batch.dense["price"]], dim=-1)
    net = model.net
    hidden = torch.cat([_cin_by_loops(net.cin, wide), net.deep(deep)], dim=-1)
    expected = net.output(net.final(hidden)).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected, atol=1e-5, rtol=1e-5)


def test_forward_backward_and_loss():
    model = _model()
    train_one_batch(model)
    tables = model.embedding.tables
    assert tables["cate_id_wide"].weight.grad.abs().sum() > 0
    assert tables["item_id"].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("text, message", [
    (CONFIG.replace("group_type: WIDE", "group_type: DEEP"),
     r"xdeepfm needs a WIDE feature group \(the CIN's input\)"),
    (CONFIG[CONFIG.index('feature_groups { group_name: "deep"'):],
     r"xdeepfm needs a WIDE feature group \(the CIN's input\)"),
    (CONFIG.replace('group_name: "deep" feature_names: ["user_id", "item_id", "price"]\n'
                    '                 group_type: DEEP',
                    'group_name: "deep" feature_names: ["user_id"] group_type: WIDE'),
     r"xdeepfm needs a DEEP feature group \(the deep MLP's input\)"),
    (CONFIG.replace("cin_layer_size: [4, 2]", ""), r"xdeepfm.cin: cin_layer_size=\[\]"),
    (CONFIG.replace("cin_layer_size: [4, 2]", "cin_layer_size: [4, 0]"),
     r"xdeepfm.cin: cin_layer_size=\[4, 0\]"),
    (CONFIG.replace("final { hidden_units: [4] }", "final { }"), "xdeepfm.final"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG,
     "feature group 'seq' is SEQUENCE; xdeepfm reads WIDE groups"),
], ids=["wide-group-made-deep", "only-deep", "no-deep-group", "no-cin-layers", "cin-size-0",
        "bad-final", "sequence-group"])
def test_config_errors_name_the_group_or_field(text, message):
    with pytest.raises(ModelError, match=message):
        _model(text)

"""DCN v1 and v2 on the fakes: logits against the cross networks' formulas spelled out,
optional parts, config errors that name the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import DCNV1, DCNV2, ModelError

NAMES = ("user_id", "item_id", "cate_id")
GROUP = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
"""
V1 = GROUP + """
dcn_v1 {
  cross_tower { cross_num: 2 }
  deep_tower { hidden_units: [8, 4] }
  final_dnn { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""
V2 = GROUP + """
dcn_v2 {
  backbone { hidden_units: [6] }
  cross { cross_num: 2 low_rank: 3 }
  deep { hidden_units: [8, 4] }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
"""
# Two DEEP groups: x_0 is both, concatenated in group order.
V2_TWO_GROUPS = V2.replace(GROUP, """
feature_groups { group_name: "ids" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
feature_groups { group_name: "raw" feature_names: ["price"] group_type: DEEP }
""")
V2_BARE = GROUP + """
dcn_v2 { cross { cross_num: 1 low_rank: 2 } final { hidden_units: [4] } }
losses { binary_cross_entropy {} }
"""


def _x0(model, batch) -> torch.Tensor:
    embedded = model.embedding(batch.sparse)
    return torch.cat([embedded.pooled[n] for n in NAMES] + [batch.dense["price"]], dim=-1)


def _v1_cross(cross, x: torch.Tensor) -> torch.Tensor:
    """x_{l+1} = x_0 x_l^T w_l + b_l + x_l (the paper's outer-product form)."""
    out = x
    for layer, bias in zip(cross.weights, cross.biases):
        out = (x.unsqueeze(2) * out.unsqueeze(1)) @ layer.weight[0] + bias + out
    return out


def _v2_cross(cross, x: torch.Tensor) -> torch.Tensor:
    """x_{l+1} = x_0 * (W_l x_l + b_l) + x_l with the full matrix W_l = V_l U_l."""
    out = x
    for down, up in zip(cross.down, cross.up):
        out = x * (out @ (up.weight @ down.weight).T + up.bias) + out
    return out


def test_v1_logits_follow_the_cross_and_deep_towers():
    model = fake_model(V1)
    assert type(model) is DCNV1
    model.eval()
    with torch.no_grad():
        for bias in model.net.cross.biases:  # non-zero, to count in the check
            bias.normal_()
    batch = make_batch(5)
    net = model.net
    x = _x0(model, batch)
    assert x.shape == (5, 3 * DIM + 1)
    hidden = torch.cat([_v1_cross(net.cross, x), net.deep(x)], dim=-1)
    expected = net.output(net.final(hidden)).squeeze(-1)
    assert net.output.bias is None  # a linear layer without bias, as in TorchEasyRec
    torch.testing.assert_close(model(batch)["logits"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("text, backbone, deep", [(V2, True, True), (V2_BARE, False, False),
                                                  (V2_TWO_GROUPS, True, True)],
                         ids=["backbone-and-deep", "cross-only", "two-groups"])
def test_v2_logits_follow_the_backbone_cross_and_deep(text, backbone, deep):
    model = fake_model(text)
    assert type(model) is DCNV2
    model.eval()
    batch = make_batch(5)
    net = model.net
    x = _x0(model, batch)
    crossed = _v2_cross(net.cross, net.backbone(x) if backbone else x)
    assert crossed.shape[1] == (6 if backbone else 3 * DIM + 1)
    parts = [crossed] + ([net.deep(x)] if deep else [])
    assert net.has_deep == deep
    expected = net.output(net.final(torch.cat(parts, dim=-1))).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("text", [V1, V2], ids=["v1", "v2"])
def test_forward_backward_and_loss(text):
    model = fake_model(text)
    train_one_batch(model)
    assert model.embedding.tables["cate_id"].weight.grad.abs().sum() > 0


def test_classes_give_a_logit_each():
    model = fake_model(V2.replace("losses { binary_cross_entropy {} }",
                                  "num_class: 3 losses { softmax_cross_entropy {} }"))
    out = model(make_batch(4))
    assert out["logits"].shape == out["probs"].shape == (4, 3)


@pytest.mark.parametrize("text, message", [
    (V1.replace("cross_num: 2", "cross_num: 0"), "dcn_v1.cross_tower: cross_num=0"),
    (V2.replace("low_rank: 3", "low_rank: 0"), "dcn_v2.cross: low_rank=0"),
    (V2.replace("cross_num: 2", "cross_num: 0"), "dcn_v2.cross: cross_num=0"),
    (V1.replace("deep_tower { hidden_units: [8, 4] }", "deep_tower { }"), "dcn_v1.deep_tower"),
    (V2.replace("final { hidden_units: [4] }", "final { dropout_ratio: 2 }"), "dcn_v2.final"),
    (V2.replace("backbone { hidden_units: [6] }", "backbone { hidden_units: [0] }"),
     "dcn_v2.backbone"),
    ('feature_groups { group_name: "wide" feature_names: ["user_id"] group_type: WIDE }' + V2,
     r"dcn_v2 reads DEEP feature groups only \(got \['wide'\]\)"),
    (V1.replace(GROUP, ""), "dcn_v1 reads DEEP feature groups only"),
], ids=["v1-no-cross-layers", "v2-rank-0", "v2-no-cross-layers", "v1-empty-deep",
        "v2-bad-final", "v2-bad-backbone", "v2-wide-group", "v1-no-group"])
def test_config_errors_name_the_field(text, message):
    with pytest.raises(ModelError, match=message):
        fake_model(text, wide=("user_id",))

"""MaskNet as a ranking model on the fakes: the logit is the mask net's output through a
linear layer without bias, parallel and serial; config errors name the field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import MaskNet, ModelError

CONFIG = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
mask_net {
  mask_net_module {
    n_mask_blocks: 2
    mask_block { reduction_ratio: 0.5 hidden_dim: 6 }
    top_mlp { hidden_units: [8, 4] }
    use_parallel: true
  }
}
losses { binary_cross_entropy {} }
"""
SERIAL = CONFIG.replace("use_parallel: true", "use_parallel: false")
NO_TOP = CONFIG.replace("top_mlp { hidden_units: [8, 4] }", "")


def _blocks_by_hand(net, x: torch.Tensor, parallel: bool) -> torch.Tensor:
    """Each block: ReLU(LayerNorm(W_h (mask(x) * h) + b_h)); h the LayerNorm of x, or in
    serial blocks after the first the previous block's output."""
    normalized = net.norm(x)
    outputs, hidden = [], normalized
    for block in net.blocks:
        mask = block.mask[2](torch.relu(block.mask[0](x)))
        hidden_in = normalized if parallel else hidden
        hidden = torch.relu(block.norm(block.hidden(mask * hidden_in)))
        outputs.append(hidden)
    return torch.cat(outputs, dim=-1) if parallel else hidden


@pytest.mark.parametrize("text, parallel, top", [(CONFIG, True, True), (SERIAL, False, True),
                                                 (NO_TOP, True, False)],
                         ids=["parallel", "serial", "no-top-mlp"])
def test_logits_follow_the_mask_blocks(text, parallel, top):
    model = fake_model(text)
    assert type(model) is MaskNet
    model.eval()
    batch = make_batch(5)
    embedded = model.embedding(batch.sparse)
    x = torch.cat([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")]
                  + [batch.dense["price"]], dim=-1)
    mask_net = model.net.mask_net
    hidden = _blocks_by_hand(mask_net, x, parallel)
    assert hidden.shape == (5, 12 if parallel else 6)
    if top:
        hidden = mask_net.top(hidden)
    # The aggregation width: int(0.5 x D), D = 3 embeddings + price
    assert mask_net.blocks[0].mask[0].out_features == (3 * DIM + 1) // 2
    assert model.net.output.bias is None and model.net.output.in_features == hidden.shape[1]
    expected = model.net.output(hidden).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected, atol=1e-5, rtol=1e-5)


def test_forward_backward_and_loss():
    model = fake_model(SERIAL)
    train_one_batch(model)
    assert model.embedding.tables["user_id"].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("text, message", [
    (CONFIG.replace("n_mask_blocks: 2", "n_mask_blocks: 0"),
     "mask_net.mask_net_module: n_mask_blocks=0"),
    (CONFIG.replace("reduction_ratio: 0.5", "reduction_ratio: 0.01"),
     "mask_net.mask_net_module: mask_block.reduction_ratio=0.01 over 13 input columns"),
    (CONFIG.replace("hidden_units: [8, 4]", "hidden_units: []"),
     "mask_net.mask_net_module.top_mlp"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "mask_net reads DEEP feature groups only"),
], ids=["no-blocks", "small-ratio", "bad-top-mlp", "sequence-group"])
def test_config_errors_name_the_field(text, message):
    with pytest.raises(ModelError, match=message):
        fake_model(text)

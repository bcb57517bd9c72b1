"""WuKong on the fakes: the dense MLP's output and the sparse embeddings as rows through
the WuKong layers, then the final MLP; config errors name the group or field."""

from __future__ import annotations

import pytest
import torch
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import ModelError, WuKong

SPARSE = ("user_id", "item_id", "cate_id")
CONFIG = """
feature_groups { group_name: "sparse" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
feature_groups { group_name: "dense" feature_names: ["price"] group_type: DEEP }
wukong {
  dense_mlp { hidden_units: [8, 4] }
  wukong_layers { lcb_feature_num: 2 fmb_feature_num: 3 compressed_feature_num: 2
                  feature_num_mlp { hidden_units: [8] } }
  wukong_layers { lcb_feature_num: 1 fmb_feature_num: 2 feature_num_mlp { hidden_units: [4] } }
  final { hidden_units: [8, 4] }
}
losses { binary_cross_entropy {} }
"""
SPARSE_ONLY = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
wukong {
  wukong_layers { lcb_feature_num: 2 fmb_feature_num: 1 compressed_feature_num: 2
                  feature_num_mlp { hidden_units: [4] } }
  final { hidden_units: [4] }
}
"""


def _sparse_rows(model, batch) -> torch.Tensor:
    embedded = model.embedding(batch.sparse)
    return torch.stack([embedded.pooled[n] for n in SPARSE], 1)


def test_registry_builds_wukong_with_its_layers():
    model = fake_model(CONFIG)
    assert type(model) is WuKong
    assert model.sparse_group.name == "sparse" and model.dense_group.name == "dense"
    first, second = model.net.layers
    # 4 rows (dense output + 3 embeddings) -> 5 -> 3; the final MLP reads 3 rows of DIM
    assert first.fmb.compress.shape == (4, 2) and first.output_rows() == 5
    assert second.fmb.compress.shape == (5, 16)  # compressed_feature_num defaults to 16
    assert model.net.final.first_weight().shape[1] == 3 * DIM
    assert model.net.output.bias is not None  # as TorchEasyRec's output layer


def test_forward_backward_and_loss():
    model = fake_model(CONFIG)
    train_one_batch(model)
    assert model.embedding.tables["cate_id"].weight.grad.abs().sum() > 0
    assert model.net.dense_mlp.first_weight().grad.abs().sum() > 0
    assert model.net.layers[0].fmb.compress.grad.abs().sum() > 0


def test_logits_follow_the_layers():
    model = fake_model(CONFIG)
    model.eval()
    batch = make_batch(5)
    dense = model.net.dense_mlp(batch.dense["price"])
    rows = torch.cat([dense.unsqueeze(1), _sparse_rows(model, batch)], dim=1)
    for layer in model.net.layers:
        rows = layer(rows)
    expected = model.net.output(model.net.final(rows.reshape(5, -1))).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)


def test_one_group_is_the_sparse_group():
    model = fake_model(SPARSE_ONLY)
    model.eval()
    assert model.dense_group is None and model.net.final.first_weight().shape[1] == 3 * DIM
    batch = make_batch(4)
    rows = model.net.layers[0](_sparse_rows(model, batch))
    expected = model.net.output(model.net.final(rows.reshape(4, -1))).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)


def test_no_layers_reads_the_rows_themselves():
    # TorchEasyRec allows an empty wukong_layers: the final MLP reads the input rows
    model = fake_model(SPARSE_ONLY.replace(SPARSE_ONLY[SPARSE_ONLY.index("  wukong_layers"):
                                                      SPARSE_ONLY.index("  final")], ""))
    model.eval()
    batch = make_batch(3)
    expected = model.net.output(model.net.final(_sparse_rows(model, batch).reshape(3, -1)))
    torch.testing.assert_close(model(batch)["logits"], expected.squeeze(-1))


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace('"cate_id"]', '"price"]'),
     "sparse group 'sparse' are rows of one matrix and need one width; they have user_id 4, "
     "item_id 4, price 1"),
    (CONFIG.replace("hidden_units: [8, 4] }\n  wukong", "hidden_units: [8, 3] }\n  wukong"),
     r"wukong.dense_mlp.hidden_units ends in 3; .* needs their width 4"),
    (CONFIG.replace("dense_mlp { hidden_units: [8, 4] }", ""),
     "wukong.dense_mlp is needed for the feature group 'dense'"),
    (SPARSE_ONLY.replace("wukong {", "wukong { dense_mlp { hidden_units: [4] }"),
     "wukong.dense_mlp is set but there is no feature group 'dense'"),
    (CONFIG.replace('group_name: "dense"', 'group_name: "raw"'),
     r"reads the group 'sparse' .* and the group 'dense' .*; got groups \['sparse', 'raw'\]"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "feature group 'seq' is SEQUENCE; wukong reads DEEP"),
    (CONFIG.replace("lcb_feature_num: 1", "lcb_feature_num: 0"),
     r"wukong.wukong_layers\[1\]: lcb_feature_num=0; allowed: 1 or more"),
    (CONFIG.replace("compressed_feature_num: 2", "compressed_feature_num: 0"),
     r"wukong.wukong_layers\[0\]: compressed_feature_num=0; allowed: 1 or more"),
    (CONFIG.replace("feature_num_mlp { hidden_units: [8] }", "feature_num_mlp { }"),
     r"wukong.wukong_layers\[0\].feature_num_mlp"),
    (CONFIG.replace("final { hidden_units: [8, 4] }", "final { hidden_units: [] }"),
     "wukong.final"),
], ids=["sparse-widths", "dense-mlp-width", "no-dense-mlp", "dense-mlp-without-group",
        "unknown-group", "sequence-group", "no-lcb-rows", "no-compression", "empty-layer-mlp",
        "bad-final"])
def test_config_errors_name_the_field(text, match):
    with pytest.raises(ModelError, match=match):
        fake_model(text)

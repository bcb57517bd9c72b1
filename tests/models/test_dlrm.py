import pytest
import torch
from model_fakes import DIM, fake_model, make_batch, train_one_batch

from hashrec.models import DLRM, ModelError

CONFIG = """
feature_groups { group_name: "sparse" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
feature_groups { group_name: "dense" feature_names: ["price"] group_type: DEEP }
dlrm {
  dense_mlp { hidden_units: [8, 4] }
  final { hidden_units: [8, 4] }
}
losses { binary_cross_entropy {} }
"""
SPARSE_ONLY = """
feature_groups { group_name: "all" feature_names: ["user_id", "item_id", "cate_id"]
                 group_type: DEEP }
dlrm { final { hidden_units: [4] } arch_with_sparse: false }
"""


def _model(text=CONFIG):
    return fake_model(text)


def _pairs(vectors: torch.Tensor) -> torch.Tensor:
    n = vectors.shape[1]
    return torch.stack([(vectors[:, i] * vectors[:, j]).sum(-1) for i in range(n)
                        for j in range(i + 1, n)], dim=1)


def test_registry_builds_dlrm_with_a_dense_group():
    model = _model()
    assert type(model) is DLRM
    assert model.sparse_group.name == "sparse" and model.dense_group.name == "dense"
    # 4 vectors (dense output + 3 embeddings): 6 pairs; then the dense output; then the
    # sparse features (arch_with_sparse defaults to true, as in TorchEasyRec)
    assert model.net.final.first_weight().shape[1] == 6 + DIM + 3 * DIM


def test_forward_backward_and_loss():
    model = _model()
    train_one_batch(model)
    assert model.embedding.tables["cate_id"].weight.grad.abs().sum() > 0
    assert model.net.dense_mlp.first_weight().grad.abs().sum() > 0


def test_logits_follow_the_interactions():
    model = _model()
    model.eval()
    batch = make_batch(5)
    embedded = model.embedding(batch.sparse)
    sparse = torch.stack([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")], 1)
    dense = model.net.dense_mlp(batch.dense["price"])
    vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)
    hidden = torch.cat([_pairs(vectors), dense, sparse.flatten(1)], dim=-1)
    expected = model.net.output(model.net.final(hidden)).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)


def test_one_group_is_the_sparse_group():
    model = _model(SPARSE_ONLY)
    model.eval()
    assert model.dense_group is None and model.net.final.first_weight().shape[1] == 3
    batch = make_batch(4)
    embedded = model.embedding(batch.sparse)
    sparse = torch.stack([embedded.pooled[n] for n in ("user_id", "item_id", "cate_id")], 1)
    expected = model.net.output(model.net.final(_pairs(sparse))).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace('"cate_id"]', '"price"]'),
     "sparse group 'sparse' interact by dot products and need one width; they have user_id "
     "4, item_id 4, price 1"),
    (CONFIG.replace("hidden_units: [8, 4] }\n  final", "hidden_units: [8, 3] }\n  final"),
     r"dlrm.dense_mlp.hidden_units ends in 3; .* needs their width 4"),
    (CONFIG.replace("dense_mlp { hidden_units: [8, 4] }", ""),
     "dlrm.dense_mlp is needed for the feature group 'dense'"),
    (SPARSE_ONLY.replace("dlrm {", "dlrm { dense_mlp { hidden_units: [4] }"),
     "dlrm.dense_mlp is set but there is no feature group 'dense'"),
    (CONFIG.replace('group_name: "dense"', 'group_name: "raw"'),
     r"reads the group 'sparse' .* and the group 'dense' .*; got groups \['sparse', 'raw'\]"),
    ('feature_groups { group_name: "seq" feature_names: ["item_id", "click_seq__item_id"] '
     'group_type: SEQUENCE }' + CONFIG, "feature group 'seq' is SEQUENCE; dlrm reads DEEP"),
    (SPARSE_ONLY.replace('["user_id", "item_id", "cate_id"]', '["user_id"]'),
     "the final MLP would read nothing"),
    (CONFIG.replace("final { hidden_units: [8, 4] }", "final { hidden_units: [] }"),
     "dlrm.final"),
], ids=["sparse-widths", "dense-mlp-width", "no-dense-mlp", "dense-mlp-without-group",
        "unknown-group", "sequence-group", "nothing-to-read", "bad-final"])
def test_config_errors_name_the_field(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)


def test_torcheasyrec_example_names_bot_mlp_and_top_mlp_build_the_same_net():
    # TorchEasyRec's example dlrm_criteo writes them (before, an unknown field)
    torch.manual_seed(0)
    ours = _model()
    torch.manual_seed(0)
    theirs = _model(CONFIG.replace("dense_mlp {", "bot_mlp {").replace("final {", "top_mlp {"))
    assert theirs.net.dense_mlp is not None
    for (name, a), (other, b) in zip(ours.net.named_parameters(),
                                     theirs.net.named_parameters(), strict=True):
        assert name == other and a.shape == b.shape
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("text,match", [
    (CONFIG.replace("dlrm {", "dlrm { bot_mlp { hidden_units: [4] }"),
     "^dlrm sets both dense_mlp and bot_mlp, which is a second name of dense_mlp"),
    (CONFIG.replace("dlrm {", "dlrm { top_mlp { hidden_units: [4] }"),
     "^dlrm sets both final and top_mlp"),
    (CONFIG.replace("final { hidden_units: [8, 4] }", ""),
     r"^dlrm.final \(or its second name top_mlp\) is not set; set it"),
], ids=["both-dense", "both-final", "no-final"])
def test_a_name_and_its_second_name_are_not_both_set(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)

import pytest
import torch
from model_fakes import MODEL_CONFIG, FakeEmbedding, FakeFeatureSet, make_batch, model_config

from hashrec.models import ModelError, MultiTowerDIN, create_model


def _model(text=MODEL_CONFIG):
    torch.manual_seed(0)
    return create_model(model_config(text), FakeFeatureSet(), None, embedding=FakeEmbedding())


def test_registry_builds_multi_tower_din():
    model = _model()
    assert isinstance(model, MultiTowerDIN)
    assert list(model.towers) == ["deep"] and list(model.din_towers) == ["seq"]
    assert model.groups["deep"].dim == 3 * 4 + 1
    assert model.groups["seq"].query_dim == 8 and model.groups["seq"].sequence_dim == 8


def test_forward_backward_shapes():
    model = _model()
    batch = make_batch(6)
    predictions = model(batch)
    assert predictions["logits"].shape == (6,)
    assert ((predictions["probs"] > 0) & (predictions["probs"] < 1)).all()
    losses = model.loss(predictions, batch)
    assert set(losses) == {"binary_cross_entropy"}
    losses["binary_cross_entropy"].backward()
    dense_grads = [p.grad for n, p in model.named_parameters() if not n.startswith("embedding")]
    assert all(g is not None for g in dense_grads)
    assert model.embedding.tables["click_seq__item_id"].weight.grad.abs().sum() > 0


def test_loss_is_binary_cross_entropy_of_sigmoid():
    model = _model()
    batch = make_batch(5)
    predictions = model(batch)
    p, y = predictions["probs"], batch.labels["clk"]
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert torch.allclose(model.loss(predictions, batch)["binary_cross_entropy"], expected,
                          atol=1e-5)


@pytest.mark.parametrize("normalizer", ["softmax", "none"])
def test_sequence_padding_is_masked(normalizer):
    torch.manual_seed(0)
    clean = MultiTowerDIN(model_config(), FakeFeatureSet(), None, embedding=FakeEmbedding(),
                          din_normalizer=normalizer)
    noisy = MultiTowerDIN(model_config(), FakeFeatureSet(), None,
                          embedding=FakeEmbedding(pad_noise=100.0), din_normalizer=normalizer)
    noisy.load_state_dict(clean.state_dict())
    clean.eval()
    noisy.eval()
    batch = make_batch(4, lengths=[2, 0, 5, 3])
    assert torch.allclose(clean(batch)["logits"], noisy(batch)["logits"], atol=1e-5)


def test_bf16_autocast_runs_dense_part():
    model = _model()
    batch = make_batch(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        predictions = model(batch)
    assert predictions["logits"].dtype == torch.float32
    assert torch.isfinite(predictions["logits"]).all()


@pytest.mark.parametrize("text,match", [
    (MODEL_CONFIG.replace('input: "deep"', 'input: "nope"'), "nope"),
    (MODEL_CONFIG.replace('input: "deep" mlp', 'input: "seq" mlp'), "SEQUENCE"),
    (MODEL_CONFIG.replace('"price"]', '"price", "click_seq__item_id"]'), "sequence features"),
    (MODEL_CONFIG.replace('"cate_id", "price"', '"cate_id", "ghost"'), "ghost"),
    (MODEL_CONFIG.replace('"item_id", "cate_id",\n                 "click_seq', '"click_seq'),
     "query"),
    (MODEL_CONFIG.replace("binary_cross_entropy {}", "softmax_cross_entropy {}"),
     "softmax_cross_entropy"),
    (MODEL_CONFIG.replace("binary_cross_entropy {}", "binary_cross_entropy {} } losses { "
                          "l2_loss {}"), "binary_cross_entropy and l2_loss together"),
    (MODEL_CONFIG + "num_class: 3", "num_class"),
    (MODEL_CONFIG.replace("hidden_units: [8, 4]", "hidden_units: []"), "towers"),
    ('feature_groups { group_name: "wide" feature_names: ["user_id"] group_type: DEEP }\n'
     + MODEL_CONFIG, r"\['wide'\] feed no tower"),
], ids=["unknown-group", "wrong-group-type", "sequence-in-deep", "unknown-feature",
        "no-query", "loss", "mixed-losses", "num-class", "empty-mlp", "group-without-tower"])
def test_config_errors_name_the_problem(text, match):
    with pytest.raises(ModelError, match=match):
        _model(text)


def test_no_model_kind():
    text = MODEL_CONFIG.split("multi_tower_din")[0]
    with pytest.raises(ModelError, match="model_config sets no model; allowed: dat, dbmtl, "
                                         "dc2vr, dcn_v1, dcn_v2, deepfm, dlrm, dlrm_hstu, dssm, "
                                         "dssm_v2, hstu_match, mask_net, "):
        _model(text)


def test_fp16_embedding_hook_unscales_sparse_gradients():
    from hashrec.train.precision import MixedPrecision

    torch.manual_seed(0)
    model = create_model(model_config(), FakeFeatureSet(), None, embedding=FakeEmbedding())
    batch = make_batch(8, seed=1)
    model.loss(model(batch), batch)["binary_cross_entropy"].backward()
    reference = model.embedding.tables["user_id"].weight.grad.clone()
    model.zero_grad()
    mp = MixedPrecision.create("FP16", torch.device("cpu"))
    with mp.autocast():
        predictions = model(batch, embedding_hook=mp.embedding_hook())
    mp.backward(model.loss(predictions, batch)["binary_cross_entropy"])
    got = model.embedding.tables["user_id"].weight.grad
    assert reference.abs().sum() > 0
    assert torch.allclose(got, reference, rtol=0.05, atol=1e-4)
    dense_grad = model.output.weight.grad
    assert dense_grad.abs().max() > 100 * reference.abs().max()  # still scaled for the scaler


@pytest.mark.parametrize("norm", ["use_bn: true", 'activation: "nn.Dice"'], ids=["bn", "dice"])
def test_training_step_on_a_batch_of_one_row(norm):
    text = MODEL_CONFIG.replace("hidden_units: [8, 4]", f"hidden_units: [8, 4] {norm}")
    text = text.replace("hidden_units: [8] }", f"hidden_units: [8] {norm} }}")
    model = _model(text)
    model.train()
    batch = make_batch(1, lengths=[1])
    predictions = model(batch)
    model.loss(predictions, batch)["binary_cross_entropy"].backward()
    assert torch.isfinite(predictions["logits"]).all()
    assert torch.isfinite(model.output.weight.grad).all()


def test_features_left_out_of_the_groups_are_named(caplog):
    with caplog.at_level("INFO", logger="hashrec.models.rank_model"):
        _model()
    assert "no feature group" not in caplog.text
    with caplog.at_level("INFO", logger="hashrec.models.rank_model"):
        create_model(model_config(), FakeFeatureSet(left_out=("user_tag", "age_level")), None,
                     embedding=FakeEmbedding())
    assert ("features in no feature group, left out (not read from the input, not embedded, "
            "no table of their own): user_tag, age_level;") in caplog.text


def test_unknown_group_feature_lists_the_left_out_ones_as_known():
    text = MODEL_CONFIG.replace('"cate_id", "price"]', '"cate_id", "user_tagg"]')
    with pytest.raises(ModelError, match=r"feature 'user_tagg' is not defined in "
                                         r"feature_configs \(known: .*price, user_id, "
                                         r"user_tag\)"):
        create_model(model_config(text), FakeFeatureSet(left_out=("user_tag",)), None,
                     embedding=FakeEmbedding())

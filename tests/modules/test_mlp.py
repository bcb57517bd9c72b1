import pytest
import torch

from hashrec.modules import MLP, MLPOptions, create_activation


@pytest.mark.parametrize("options", [
    MLPOptions(hidden_units=(8, 4)),
    MLPOptions(hidden_units=(8, 4), use_bn=True, dropout_ratio=(0.1,)),
    MLPOptions(hidden_units=(8, 4, 2), use_ln=True, dropout_ratio=(0.1, 0.2, 0.0)),
    MLPOptions(hidden_units=(5,), activation="nn.Dice", bias=False),
    MLPOptions(hidden_units=(5,), activation=""),
], ids=["plain", "bn-dropout", "ln-per-layer-dropout", "dice-nobias", "no-activation"])
def test_mlp_shapes_and_backward(options):
    torch.manual_seed(0)
    mlp = MLP(6, options)
    x = torch.randn(7, 6, requires_grad=True)
    y = mlp(x)
    assert y.shape == (7, options.hidden_units[-1])
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    y3 = mlp(torch.randn(3, 5, 6))
    assert y3.shape == (3, 5, options.hidden_units[-1])


def test_mlp_layer_structure():
    mlp = MLP(4, MLPOptions(hidden_units=(3, 2), use_bn=True, bias=False,
                            dropout_ratio=(0.5,)))
    kinds = [type(m).__name__ for m in mlp.layers[0].layers]
    assert kinds == ["Linear", "_FlatNorm", "ReLU", "Dropout"]
    assert mlp.layers[0].layers[0].bias is None


@pytest.mark.parametrize("norm, has_bias", [({}, True), ({"use_bn": True}, False),
                                            ({"use_ln": True}, True)], ids=["none", "bn", "ln"])
def test_a_linear_layer_before_batch_norm_has_no_bias(norm, has_bias):
    # TorchEasyRec's Perceptron: Linear(bias=False if use_bn else bias); layer norm keeps it
    mlp = MLP(4, MLPOptions(hidden_units=(3, 2), **norm))
    assert [layer.layers[0].bias is not None for layer in mlp.layers] == [has_bias] * 2
    assert (mlp.first_bias() is not None) == has_bias


def test_a_state_with_a_bias_before_batch_norm_restores_as_the_same_function():
    # Saved when the linear layer kept its bias before batch norm: the bias is folded into
    # the running mean, so that evaluation computes what the saved model did.
    torch.manual_seed(0)
    mlp = MLP(4, MLPOptions(hidden_units=(3, 2), use_bn=True, activation="nn.Dice"))
    mlp.train()
    for _ in range(3):
        mlp(torch.randn(16, 4) * 2 + 1)
    old = {}
    for name, value in mlp.state_dict().items():
        old[name] = value
        if name.endswith("layers.0.weight"):
            old[name.replace("weight", "bias")] = torch.randn(value.shape[0])
    mlp.eval()
    x = want = torch.randn(5, 4)
    with torch.no_grad():  # the saved model: each linear layer with its bias
        for i, layer in enumerate(mlp.layers):
            linear = torch.nn.functional.linear(want, layer.linear_weight(),
                                                old[f"layers.{i}.layers.0.bias"])
            want = layer.after_linear(linear)
    fresh = MLP(4, MLPOptions(hidden_units=(3, 2), use_bn=True, activation="nn.Dice"))
    fresh.load_state_dict(old)  # strict: the biases are consumed
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), want)


def test_mlp_bn_flattens_leading_dims():
    mlp = MLP(4, MLPOptions(hidden_units=(3,), use_bn=True, activation=""))
    mlp.train()
    y = mlp(torch.randn(6, 5, 4) * 3 + 2)
    flat = y.reshape(-1, 3)
    assert torch.allclose(flat.mean(0), torch.zeros(3), atol=1e-5)


def test_dropout_only_in_training():
    mlp = MLP(4, MLPOptions(hidden_units=(16,), dropout_ratio=(0.5,)))
    x = torch.randn(32, 4)
    mlp.eval()
    assert torch.equal(mlp(x), mlp(x))


@pytest.mark.parametrize("kwargs,field", [
    ({"hidden_units": ()}, "hidden_units"),
    ({"hidden_units": (4, 0)}, "hidden_units"),
    ({"hidden_units": (4, 2), "dropout_ratio": (0.1, 0.2, 0.3)}, "dropout_ratio"),
    ({"dropout_ratio": (1.5,)}, "dropout_ratio"),
    ({"use_bn": True, "use_ln": True}, "use_bn"),
    ({"activation": "nn.Swoosh"}, "nn.Swoosh"),
], ids=["empty", "zero-unit", "dropout-count", "dropout-range", "bn-and-ln", "activation"])
def test_options_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MLPOptions(**kwargs)


def test_dropout_scalar_is_accepted():
    assert MLPOptions(hidden_units=(3, 2), dropout_ratio=0.25).dropout_of(1) == 0.25


def test_dice_gates_between_identity_and_alpha():
    dice = create_activation("Dice", 3)
    dice.eval()
    with torch.no_grad():
        dice.alpha.fill_(0.0)
    x = torch.tensor([[100.0, -100.0, 0.0]])
    y = dice(x)
    assert y[0, 0] > 0 and y[0, 1] <= 0


def test_activations_take_torcheasyrecs_names_and_keyword_arguments():
    leaky = create_activation("nn.LeakyReLU(negative_slope=0.2)", 4)
    assert isinstance(leaky, torch.nn.LeakyReLU) and leaky.negative_slope == 0.2
    assert isinstance(create_activation("torch.nn.Softplus(beta=2)", 4), torch.nn.Softplus)
    assert isinstance(create_activation(" nn.SELU ", 4), torch.nn.SELU)
    mlp = MLP(6, MLPOptions(hidden_units=(5, 5), activation="nn.PReLU(num_parameters=5)"))
    assert mlp(torch.randn(2, 6)).shape == (2, 5)
    torch.jit.script(mlp)  # exportable
    for bad, why in [("nn.Softmax2d", "not supported"), ("nn.LeakyReLU(0.2)", "keyword"),
                     ("nn.LeakyReLU(slope=0.2)", "slope"), ("nn.ELU(alpha=1.0", "closed"),
                     ("nn.Dice(eps=1)", "no arguments"), ("nn.Threshold", "threshold"),
                     ("nn.ReLU(inplace=x)", "literal")]:
        with pytest.raises(ValueError, match=why):
            MLPOptions(hidden_units=(3,), activation=bad)


def test_dice_is_torcheasyrecs_with_a_learned_batch_norm():
    # TorchEasyRec's Dice: BatchNorm1d(dim) (affine, eps 1e-5), alpha from 0.
    torch.manual_seed(0)
    dice = create_activation("nn.Dice", 4)
    assert sorted(n for n, _ in dice.named_parameters()) == \
        ["alpha", "norm.bias", "norm.weight"]
    assert not dice.alpha.any()
    with torch.no_grad():
        dice.alpha.copy_(torch.tensor([0.1, -0.2, 0.3, 0.5]))
        dice.norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
        dice.norm.bias.copy_(torch.tensor([0.0, 0.3, -0.4, 1.0]))
    x = torch.randn(6, 4) * 1e-3  # small inputs: eps 1e-5 against 1e-9 shows
    mean, var = x.mean(0), x.var(0, unbiased=False)
    p = torch.sigmoid((x - mean) / torch.sqrt(var + 1e-5) * dice.norm.weight + dice.norm.bias)
    expected = p * x + (1 - p) * dice.alpha * x
    torch.testing.assert_close(dice(x), expected)
    # A sequence (B, L, dim) normalizes over every row of every item, as TorchEasyRec's
    # (B, dim, L) batch norm does.
    seq = torch.randn(2, 3, 4)
    torch.testing.assert_close(dice(seq), dice(seq.reshape(6, 4)).reshape(2, 3, 4))


def test_dice_restores_a_state_saved_without_its_scale_and_shift():
    # Saved before Dice's batch norm was affine: no norm.weight / norm.bias.
    mlp = MLP(4, MLPOptions(hidden_units=(3, 2), activation="nn.Dice"))
    old = {k: v for k, v in mlp.state_dict().items()
           if not k.endswith(("norm.weight", "norm.bias"))}
    assert len(old) == len(mlp.state_dict()) - 4
    fresh = MLP(4, MLPOptions(hidden_units=(3, 2), activation="nn.Dice"))
    with torch.no_grad():
        for p in fresh.parameters():
            p.fill_(7.0)
    fresh.load_state_dict(old)  # strict
    for name, value in fresh.state_dict().items():
        if name.endswith("norm.weight"):
            assert torch.equal(value, torch.ones_like(value)), name
        elif name.endswith("norm.bias"):
            assert torch.equal(value, torch.zeros_like(value)), name
        else:
            assert torch.equal(value, old[name]), name


@pytest.mark.parametrize("options", [
    MLPOptions(hidden_units=(3,), use_bn=True, activation=""),
    MLPOptions(hidden_units=(3,), activation="nn.Dice"),
], ids=["batch-norm", "dice"])
@pytest.mark.parametrize("shape", [(1, 4), (1, 1, 4)], ids=["row", "sequence-of-one"])
def test_training_batch_of_one_row_uses_running_statistics(options, shape):
    torch.manual_seed(0)
    mlp = MLP(4, options)
    mlp.train()
    mlp(torch.randn(16, 4) * 3 + 1)  # running statistics away from their start
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    x = torch.randn(*shape, requires_grad=True)
    y = mlp(x)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(torch.equal(v, before[k]) for k, v in mlp.state_dict().items())
    mlp.eval()
    torch.testing.assert_close(y, mlp(x))

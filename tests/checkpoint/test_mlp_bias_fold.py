"""Checkpoints written when an MLP's linear layers kept their bias before batch norm:
restored, resumed or fine-tuned from, the model computes what the saved one did."""

from __future__ import annotations

import torch

from hashrec.checkpoint import restore_checkpoint, save_checkpoint
from hashrec.checkpoint.fine_tune import restore_fine_tune
from hashrec.modules.mlp import MLP, MLPOptions

OPTIONS = MLPOptions(hidden_units=(3, 2), use_bn=True, activation="nn.ReLU")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(4, OPTIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def _old_model() -> _Model:
    """A trained model whose linear layers carry a bias, as before they lost it."""
    torch.manual_seed(0)
    model = _Model()
    for layer in model.mlp.layers:
        linear = layer.layers[0]
        linear.bias = torch.nn.Parameter(torch.randn(linear.out_features))
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 4) * 2 + 1)
    return model.eval()


def _outputs(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)


def test_fine_tuning_from_a_state_with_a_bias_before_batch_norm(tmp_path):
    old = _old_model()
    path = save_checkpoint(str(tmp_path / "old"), 5, old, None, {})
    x = torch.randn(7, 4)
    new = _Model()
    restore_fine_tune(path, new, {}, tag_tables={})
    torch.testing.assert_close(_outputs(new, x), _outputs(old, x))


def test_resuming_a_state_with_a_bias_before_batch_norm_keeps_the_optimizer(tmp_path):
    old = _old_model()
    optimizer = torch.optim.Adam(old.parameters(), lr=0.1)
    old.train()
    old(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    old.eval()
    path = save_checkpoint(str(tmp_path / "old"), 5, old, optimizer, {})
    x = torch.randn(7, 4)
    new = _Model()
    new_optimizer = torch.optim.Adam(new.parameters(), lr=0.1)
    restore_checkpoint(path, new, new_optimizer, {})
    torch.testing.assert_close(_outputs(new, x), _outputs(old, x))
    saved = {id(p): optimizer.state[p] for p in old.parameters()}
    by_name = dict(old.named_parameters())
    for name, param in new.named_parameters():
        want = saved[id(by_name[name])]
        torch.testing.assert_close(new_optimizer.state[param]["exp_avg"], want["exp_avg"])

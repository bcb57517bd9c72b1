"""PEPNet's gates against their formulas written out by hand: the gate unit's bound
gamma, EPNet's column scaling, PPNet's gated layers, the stop-gradient on the main
input inside the gates, and the towers per domain with each row's domain picked."""

from __future__ import annotations

import pytest
import torch

from hashrec.modules.personalized import DomainTowers, EPNet, GateNU, PPNet, pick_domain


def _gate_by_hand(gate: GateNU, x: torch.Tensor) -> torch.Tensor:
    h = torch.clamp(x @ gate.hidden.weight.T + gate.hidden.bias, min=0)
    z = h @ gate.output.weight.T + gate.output.bias
    return gate.gamma / (1 + torch.exp(-z))


@pytest.mark.parametrize("gamma", [0.5, 2.0, 3.0], ids=lambda g: f"gamma{g}")
def test_gate_unit_is_gamma_times_a_sigmoid(gamma):
    torch.manual_seed(0)
    gate = GateNU(5, 3, 4, gamma)
    x = torch.randn(7, 5)
    out = gate(x)
    torch.testing.assert_close(out, _gate_by_hand(gate, x))
    assert out.shape == (7, 4)
    assert (out > 0).all() and (out < gamma).all()


def test_gate_unit_reaches_its_bound_and_zero():
    gate = GateNU(2, 2, 1, gamma=2.0)
    with torch.no_grad():
        gate.hidden.weight.copy_(torch.eye(2))
        gate.hidden.bias.zero_()
        gate.output.weight.fill_(100.0)
        gate.output.bias.zero_()
    out = gate(torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    # a large positive score saturates at gamma; relu(negative) = 0 -> sigmoid(0) * gamma = 1
    torch.testing.assert_close(out, torch.tensor([[2.0], [1.0]]))


@pytest.mark.parametrize("kwargs, message", [
    ({"gamma": 0.0}, "gamma=0.0"), ({"gamma": float("inf")}, "gamma=inf"),
    ({"hidden_dim": 0}, "hidden_dim=0"),
], ids=["zero-gamma", "inf-gamma", "no-hidden"])
def test_gate_unit_refuses_bad_options(kwargs, message):
    options = {"in_dim": 2, "hidden_dim": 2, "out_dim": 2, "gamma": 2.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        GateNU(**options)


def test_epnet_scales_each_embedding_column_by_the_domain_gate():
    torch.manual_seed(1)
    epnet = EPNet(main_dim=6, domain_dim=2, hidden_dim=4, gamma=2.0)
    main, domain = torch.randn(5, 6), torch.randn(5, 2)
    gate = _gate_by_hand(epnet.gate, torch.cat([domain, main], dim=-1))
    torch.testing.assert_close(epnet(main, domain), main * gate)


def test_epnet_gate_passes_no_gradient_to_the_main_embeddings():
    torch.manual_seed(2)
    epnet = EPNet(3, 2, 4)
    main = torch.randn(4, 3, requires_grad=True)
    domain = torch.randn(4, 2, requires_grad=True)
    epnet(main, domain).sum().backward()
    gate = _gate_by_hand(epnet.gate, torch.cat([domain, main], dim=-1)).detach()
    # d(main * gate)/d(main) with the gate constant in main
    torch.testing.assert_close(main.grad, gate)
    assert domain.grad is not None and domain.grad.abs().sum() > 0


def test_ppnet_layers_are_gated_by_the_prior_features():
    torch.manual_seed(3)
    ppnet = PPNet(in_dim=5, uia_dim=3, hidden_units=(4, 2), activation="nn.ReLU",
                  gamma=2.0)
    x, uia = torch.randn(6, 5), torch.randn(6, 3)
    prior = torch.cat([uia, x], dim=-1)
    expected = x
    for layer in ppnet.layers:
        linear = expected @ layer.linear.weight.T + layer.linear.bias
        expected = torch.clamp(linear, min=0) * _gate_by_hand(layer.gate, prior)
    out = ppnet(x, uia)
    assert out.shape == (6, 2) and ppnet.out_dim == 2
    torch.testing.assert_close(out, expected)


def test_ppnet_dropout_follows_the_gate_and_is_off_in_eval():
    ppnet = PPNet(3, 2, (4,), dropout=(0.5,))
    assert isinstance(ppnet.layers[0].dropout, torch.nn.Dropout)
    ppnet.eval()
    x, uia = torch.randn(5, 3), torch.randn(5, 2)
    torch.testing.assert_close(ppnet(x, uia), ppnet(x, uia))
    with pytest.raises(ValueError, match="2 ratios for 1 layers"):
        PPNet(3, 2, (4,), dropout=(0.1, 0.1))


def test_domain_towers_side_by_side_and_each_rows_domain_picked_by_hand():
    torch.manual_seed(0)
    towers = [torch.nn.Linear(5, 2) for _ in range(3)]
    x = torch.randn(6, 5)
    logits = DomainTowers(towers)(x)
    assert logits.shape == (6, 3 * 2)
    for k, tower in enumerate(towers):
        torch.testing.assert_close(logits[:, 2 * k:2 * k + 2], tower(x))
    domains = torch.tensor([2, 0, 1, 2, 2, 0])
    picked = pick_domain(logits, domains, 3)
    by_hand = torch.stack([logits[i, 2 * int(d):2 * int(d) + 2]
                           for i, d in enumerate(domains)])
    torch.testing.assert_close(picked, by_hand)
    # one logit a domain: (B, K) -> (B, 1)
    torch.testing.assert_close(pick_domain(logits[:, :3], domains, 3).squeeze(-1),
                               logits[torch.arange(6), domains])


def test_pick_domain_passes_gradient_to_each_rows_domain_alone():
    logits = torch.randn(4, 3, requires_grad=True)
    domains = torch.tensor([0, 2, 2, 0])
    pick_domain(logits, domains, 3).sum().backward()
    expected = torch.zeros(4, 3)
    expected[torch.arange(4), domains] = 1.0
    torch.testing.assert_close(logits.grad, expected)


def test_domain_towers_need_a_tower():
    with pytest.raises(ValueError, match="DomainTowers.towers is empty"):
        DomainTowers([])

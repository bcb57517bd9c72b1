"""MIND's behaviour-to-interest (B2I) capsule layer (https://arxiv.org/abs/1904.08030).

A user's behaviour sequence (B, L, d), cut or zero-padded to ``max_seq_len`` S, is routed
into up to ``max_k`` K interest capsules of width H:

* low capsules u_s = normalize(e_s W), W (d, H) shared by every capsule (B2I routing);
* routing logits b (B, S, K) start from a fixed (S, K) draw of N(0, stddev^2) (or zeros),
  made once when the layer is built and kept in its state (so training and serving route
  alike and an export computes what the trained model does);
* each of ``num_iters`` rounds: w = softmax over the user's capsules of b (a capsule
  beyond the user's count gets no weight), zero at padded positions; capsule
  c_k = squash(sum_s w_sk u_s); b_sk += scale * <c_k, u_s>;
* squash(s) = (|s|^2 / (1 + |s|^2))^squash_pow * s / |s|.

A user with n behaviours gets max(1, min(K, log2 n)) interests, rounded up (all K with
``const_caps_num``); the others are zero and ``forward``'s mask is False there. Shapes
are fixed and nothing is read back to the host.

No ``from __future__ import annotations`` here: TorchScript reads these annotations.
"""

import math

import torch
from torch import nn


def squash(capsules: torch.Tensor, power: float) -> torch.Tensor:
    """(..., H) -> (..., H): each vector s scaled to length (|s|^2 / (1 + |s|^2))^power."""
    # clamped: no infinite gradient at s = 0
    square = (capsules * capsules).sum(dim=-1, keepdim=True).clamp_min(1e-14)
    return capsules * (torch.pow(square / (1.0 + square), power) / torch.sqrt(square))


def interest_mask(lengths: torch.Tensor, max_k: int, constant: bool) -> torch.Tensor:
    """Sequence lengths (B,) -> (B, max_k) bool, True for the interests a user gets:
    max(1, min(max_k, log2 length)) rounded up, or all ``max_k`` where ``constant``."""
    positions = torch.arange(max_k, device=lengths.device)
    if constant:
        return (positions.unsqueeze(0) < max_k).expand(lengths.shape[0], max_k)
    count = torch.log2(lengths.float()).clamp(min=1.0, max=float(max_k))
    return positions.unsqueeze(0).float() < count.unsqueeze(1)


class CapsuleLayer(nn.Module):
    """See the module docstring.

    Args:
        input_dim: width d of a behaviour.
        max_k: most interests K.
        max_seq_len: behaviours routed, S (longer sequences are cut).
        high_dim: width H of an interest.
        num_iters: routing rounds (>= 1).
        routing_logits_scale: factor of the agreements added to the logits.
        routing_logits_stddev: standard deviation of the initial logits ("normal").
        squash_pow: the squash's power (> 0).
        const_caps_num: every user gets K interests.
        routing_init: "normal" or "zeros".

    Shapes: sequence (B, L, d), lengths (B,) -> (interests (B, K, H), mask (B, K) bool).
    """

    max_k: int
    max_seq_len: int
    num_iters: int
    scale: float
    squash_pow: float
    const_caps_num: bool

    def __init__(self, input_dim: int, max_k: int, max_seq_len: int, high_dim: int,
                 num_iters: int = 3, routing_logits_scale: float = 20.0,
                 routing_logits_stddev: float = 1.0, squash_pow: float = 1.0,
                 const_caps_num: bool = False, routing_init: str = "normal") -> None:
        super().__init__()
        checks = {"input_dim": input_dim, "max_k": max_k, "max_seq_len": max_seq_len,
                  "high_dim": high_dim, "num_iters": num_iters}
        for name, value in checks.items():
            if value < 1:
                raise ValueError(f"{name}={value}; allowed: 1 or more")
        if not (math.isfinite(squash_pow) and squash_pow > 0):
            raise ValueError(f"squash_pow={squash_pow}; allowed: a finite number > 0")
        if not (math.isfinite(routing_logits_stddev) and routing_logits_stddev >= 0):
            raise ValueError(f"routing_logits_stddev={routing_logits_stddev}; allowed: a "
                             f"finite number >= 0")
        if not math.isfinite(routing_logits_scale):
            raise ValueError(f"routing_logits_scale={routing_logits_scale}; allowed: a "
                             f"finite number")
        if routing_init not in ("normal", "zeros"):
            raise ValueError(f"routing_init_method={routing_init!r}; allowed: 'normal', "
                             f"'zeros'")
        self.max_k = max_k
        self.max_seq_len = max_seq_len
        self.num_iters = num_iters
        self.scale = float(routing_logits_scale)
        self.squash_pow = float(squash_pow)
        self.const_caps_num = bool(const_caps_num)
        self.bilinear = nn.Parameter(torch.randn(input_dim, high_dim) / math.sqrt(input_dim))
        initial = torch.zeros(max_seq_len, max_k)
        if routing_init == "normal":
            initial = torch.randn(max_seq_len, max_k) * routing_logits_stddev
        self.register_buffer("initial_logits", initial)

    def forward(self, sequence: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        sequence = sequence[:, :self.max_seq_len]
        sequence = nn.functional.pad(sequence, [0, 0, 0, self.max_seq_len - sequence.shape[1]])
        positions = torch.arange(self.max_seq_len, device=lengths.device)
        present = (positions.unsqueeze(0) < lengths.unsqueeze(1)).to(sequence.dtype)
        mask = interest_mask(lengths, self.max_k, self.const_caps_num)
        low = nn.functional.normalize(torch.matmul(sequence, self.bilinear.to(sequence.dtype)),
                                      p=2.0, dim=-1) * present.unsqueeze(-1)
        # a capsule the user lacks: finite, so that no NaN appears
        excluded = torch.full_like(self.initial_logits, -1e9).to(low.dtype)
        logits = self.initial_logits.to(low.dtype).unsqueeze(0).expand(
            sequence.shape[0], -1, -1)
        capsules = torch.zeros(sequence.shape[0], self.max_k, low.shape[-1],
                               dtype=low.dtype, device=low.device)
        for _ in range(self.num_iters):
            weights = torch.softmax(torch.where(mask.unsqueeze(1), logits,
                                                excluded.unsqueeze(0)), dim=-1)
            weights = weights * present.unsqueeze(-1)
            capsules = squash(torch.einsum("bsk,bsh->bkh", weights, low), self.squash_pow)
            logits = logits + self.scale * torch.einsum("bkh,bsh->bsk", capsules, low)
        return capsules * mask.unsqueeze(-1).to(capsules.dtype), mask

"""Compressed interaction network (CIN), xDeepFM's explicit vector-wise interactions.

The input X^0 (B, F, d) holds F feature embeddings of d columns. Layer k (of
``layer_sizes[k]`` = H_k feature maps) takes X^{k-1} (B, H_{k-1}, d), H_0 = F, and
computes, for every map h and column e,

    X^k[b, h, e] = sum_{i, j} W^k[h, i, j] * X^{k-1}[b, i, e] * X^0[b, j, e] + c^k[h],

a weighted sum of the columnwise products of every (previous map, input feature) pair.
Each layer's maps summed over the d columns, (B, H_k), are concatenated over the
layers: the output (B, sum of layer_sizes).
"""

from __future__ import annotations

import torch
from torch import nn


class CIN(nn.Module):
    """``forward(x (B, F, d)) -> (B, sum(layer_sizes))``; see the module docstring.

    Args:
        num_features: F (1 or more).
        layer_sizes: H_k of each layer (at least one layer, each 1 or more).

    Raises:
        ValueError: no layer, or a size or num_features below 1.
    """

    def __init__(self, num_features: int, layer_sizes: tuple[int, ...] | list[int]) -> None:
        super().__init__()
        sizes = [int(size) for size in layer_sizes]
        if num_features < 1:
            raise ValueError(f"CIN num_features must be > 0, got {num_features}")
        if not sizes or min(sizes) < 1:
            raise ValueError(f"cin_layer_size={sizes}; allowed: one size or more, each 1 "
                             f"or more feature maps")
        self.num_features = num_features
        previous = [num_features] + sizes[:-1]
        # W^k as a linear map over the H_{k-1} * F pair products (its bias is c^k).
        self.layers = nn.ModuleList([nn.Linear(h * num_features, size)
                                     for h, size in zip(previous, sizes)])
        self._output_dim = sum(sizes)

    def output_dim(self) -> int:
        """The sum of the layer sizes."""
        return self._output_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, features, dim = x.shape[0], x.shape[1], x.shape[2]
        hidden = x
        outputs: list[torch.Tensor] = []
        for layer in self.layers:
            # (B, H, 1, d) * (B, 1, F, d) -> the pair products per column, (B, d, H * F)
            # (sizes spelled out: an empty batch cannot infer one)
            pairs = (hidden.unsqueeze(2) * x.unsqueeze(1)).reshape(
                batch, hidden.shape[1] * features, dim)
            maps = layer(pairs.transpose(1, 2))  # (B, d, H_k)
            outputs.append(maps.sum(dim=1))
            hidden = maps.transpose(1, 2)
        return torch.cat(outputs, dim=-1)

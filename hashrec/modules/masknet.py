"""MaskNet (Wang et al. 2021): instance-guided masks over a feature vector.

The net's input x (B, D) is the mask input of every block; its LayerNorm is the
hidden input of the first block (of every block, in parallel). A block with hidden
input h (B, D_h) computes ``mask = Linear(agg -> D_h)(ReLU(Linear(D -> agg)(x)))`` and
outputs ``ReLU(LayerNorm(Linear(D_h -> hidden_dim)(mask * h)))`` (B, hidden_dim).
Parallel blocks' outputs are concatenated (B, n * hidden_dim); serial blocks chain, each
reading the previous block's output, and the last one's is the output. An optional top
MLP follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hashrec.modules.mlp import MLP, MLPOptions


@dataclass(frozen=True)
class MaskBlockOptions:
    """Options of every block of one MaskNet.

    Attributes:
        hidden_dim: the block's output width (1 or more).
        reduction_ratio: the mask's aggregation width over the block's hidden input
            width D_h (``int(reduction_ratio * D_h)``: the net's input width D in parallel
            blocks and the first serial one, hidden_dim in the later serial ones; used
            without aggregation_dim).
        aggregation_dim: the mask's aggregation width (1 or more); None for
            reduction_ratio's.
    """

    hidden_dim: int = 64
    reduction_ratio: float = 1.0
    aggregation_dim: int | None = None

    def __post_init__(self) -> None:
        if self.hidden_dim < 1:
            raise ValueError(f"mask_block.hidden_dim={self.hidden_dim}; allowed: 1 or more")
        if self.aggregation_dim is not None and self.aggregation_dim < 1:
            raise ValueError(f"mask_block.aggregation_dim={self.aggregation_dim}; allowed: "
                             "1 or more (or unset, for reduction_ratio's)")

    def aggregation_width(self, input_dim: int) -> int:
        """The mask's aggregation width over a hidden input of ``input_dim`` columns.

        Raises:
            ValueError: the width is below 1.
        """
        if self.aggregation_dim is not None:
            return self.aggregation_dim
        ratio = self.reduction_ratio
        width = int(ratio * input_dim) if math.isfinite(ratio) and ratio > 0 else 0
        if width < 1:
            raise ValueError(
                f"mask_block.reduction_ratio={ratio:g} over {input_dim} input "
                f"columns gives an aggregation width of {width}; allowed: 1 or more (raise "
                "reduction_ratio or set aggregation_dim)")
        return width


class MaskBlock(nn.Module):
    """One mask block: ``forward(mask_input (B, D), hidden (B, D_h)) -> (B, hidden_dim)``.

    Args:
        input_dim: D, the mask input's width.
        hidden_input_dim: D_h, the hidden input's width (the mask's width).
        options: the aggregation and output widths.
    """

    def __init__(self, input_dim: int, hidden_input_dim: int,
                 options: MaskBlockOptions) -> None:
        super().__init__()
        # reduction_ratio scales the hidden input's width, as TorchEasyRec's MaskBlock
        # does (the net's input in parallel and in the first serial block).
        aggregation = options.aggregation_width(hidden_input_dim)
        self.mask = nn.Sequential(nn.Linear(input_dim, aggregation), nn.ReLU(),
                                  nn.Linear(aggregation, hidden_input_dim))
        self.hidden = nn.Linear(hidden_input_dim, options.hidden_dim)
        self.norm = nn.LayerNorm(options.hidden_dim)

    def forward(self, mask_input: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        masked = self.mask(mask_input) * hidden
        return torch.relu(self.norm(self.hidden(masked)))


class MaskNet(nn.Module):
    """MaskNet: ``forward(x (B, in_features)) -> (B, output_dim())``.

    Args:
        in_features: D, the input's width.
        n_mask_blocks: number of blocks (1 or more).
        block: every block's options.
        top_mlp: the MLP over the blocks' output; None for none.
        parallel: the blocks read the normalized input side by side (True) or chain.

    Raises:
        ValueError: n_mask_blocks or in_features below 1, or an aggregation width
            below 1.
    """

    def __init__(self, in_features: int, n_mask_blocks: int, block: MaskBlockOptions,
                 top_mlp: MLPOptions | None = None, parallel: bool = True) -> None:
        super().__init__()
        if in_features < 1:
            raise ValueError(f"MaskNet in_features must be > 0, got {in_features}")
        if n_mask_blocks < 1:
            raise ValueError(f"n_mask_blocks={n_mask_blocks}; allowed: 1 or more")
        self.norm = nn.LayerNorm(in_features)
        widths = [in_features] + [in_features if parallel else block.hidden_dim] \
            * (n_mask_blocks - 1)
        self.blocks = nn.ModuleList([MaskBlock(in_features, w, block) for w in widths])
        self.parallel = parallel
        width = block.hidden_dim * (n_mask_blocks if parallel else 1)
        self.top: nn.Module = nn.Identity()
        self._output_dim = width
        if top_mlp is not None:
            mlp = MLP(width, top_mlp)
            self.top = mlp
            self._output_dim = mlp.output_dim()

    def output_dim(self) -> int:
        """Size of the output's last dimension."""
        return self._output_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(x)
        if self.parallel:
            outputs = [block(x, hidden) for block in self.blocks]
            hidden = torch.cat(outputs, dim=-1)
        else:
            for block in self.blocks:
                hidden = block(x, hidden)
        return self.top(hidden)

"""MultiTowerDIN: an MLP tower per DEEP group, a DIN tower per SEQUENCE group.

Every feature group feeds exactly one tower: a group that no tower names is an error
rather than a part of the config that is silently left out.

The towers' outputs (MLP towers first, then DIN towers) are concatenated, passed
through the optional ``final`` MLP and a linear layer to one logit per row; the
prediction is its sigmoid. Without ``din_towers`` this is ``MultiTower``.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import SEQUENCE, sequence_input
from hashrec.models.mlp_config import mlp_options
from hashrec.models.multi_tower import MultiTower
from hashrec.modules import DINAttention


class MultiTowerDIN(MultiTower):
    """See the module docstring; arguments as ``RankModel``.

    Args:
        din_normalizer: DIN attention weighting, ``softmax`` (default) or ``none``.
    """

    kind = "multi_tower_din"
    tower_fields = ("towers", "din_towers")

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None, din_normalizer: str = "softmax") -> None:
        # Read by _build_towers, which the base constructor calls.
        self.din_normalizer = din_normalizer
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)

    def _build_towers(self, config) -> int:
        """The MLP towers, then a DIN tower per ``din_towers`` entry."""
        self.din_towers = nn.ModuleDict()
        width = super()._build_towers(config)
        for tower in config.din_towers:
            where = f"{self.kind}.din_towers[{tower.input!r}]"
            group = self.group(tower.input, SEQUENCE, where)
            self._check_unique(tower.input)
            try:
                attention = DINAttention(group.query_dim, group.sequence_dim,
                                         mlp_options(tower.attn_mlp, where + ".attn_mlp"),
                                         self.din_normalizer)
            except ValueError as err:
                raise ModelError(f"{where}: {err}") from err
            self.din_towers[tower.input] = attention
            width += attention.output_dim()
        return width

    def _feeds_a_tower(self, name: str) -> bool:
        return super()._feeds_a_tower(name) or name in self.din_towers

    def _tower_hint(self) -> str:
        return "towers (DEEP) or din_towers (SEQUENCE)"

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """Each tower's input, then each DIN tower's (query, sequence, lengths)."""
        inputs = list(super().dense_inputs(embedded, batch))
        for name in self.din_towers:
            inputs.extend(sequence_input(self.groups[name], embedded, batch))
        return tuple(inputs)

    def _tower_outputs(self, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        outputs = super()._tower_outputs(inputs)
        count = self._tower_inputs_count()
        for i, attention in enumerate(self.din_towers.values()):
            query, sequence, lengths = inputs[count + 3 * i:count + 3 * i + 3]
            outputs.append(attention(query, sequence, lengths))
        return outputs

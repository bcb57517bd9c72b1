"""MultiTowerDIN: an MLP tower per DEEP group, a DIN tower per SEQUENCE group.

Every feature group feeds exactly one tower: a group that no tower names is an error
rather than a part of the config that is silently left out.

The towers' outputs are concatenated, passed through the optional ``final``
MLP and a linear layer to one logit per row; the prediction is its sigmoid.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, SEQUENCE, deep_input, sequence_input
from hashrec.models.rank_model import RankModel, mlp_options
from hashrec.modules import MLP, DINAttention


class MultiTowerDIN(RankModel):
    """See the module docstring; arguments as ``RankModel``.

    Args:
        din_normalizer: DIN attention weighting, ``softmax`` (default) or ``none``.
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None, din_normalizer: str = "softmax") -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.multi_tower_din
        if not config.towers and not config.din_towers:
            raise ModelError("multi_tower_din has no towers and no din_towers")
        self.towers = nn.ModuleDict()
        self.din_towers = nn.ModuleDict()
        width = 0
        for tower in config.towers:
            where = f"multi_tower_din.towers[{tower.input!r}]"
            group = self.group(tower.input, DEEP, where)
            self._check_unique(tower.input)
            self.towers[tower.input] = MLP(group.dim, mlp_options(tower.mlp, where + ".mlp"))
            width += self.towers[tower.input].output_dim()
        for tower in config.din_towers:
            where = f"multi_tower_din.din_towers[{tower.input!r}]"
            group = self.group(tower.input, SEQUENCE, where)
            self._check_unique(tower.input)
            try:
                attention = DINAttention(group.query_dim, group.sequence_dim,
                                         mlp_options(tower.attn_mlp, where + ".attn_mlp"),
                                         din_normalizer)
            except ValueError as err:
                raise ModelError(f"{where}: {err}") from err
            self.din_towers[tower.input] = attention
            width += attention.output_dim()
        unused = [name for name in self.groups
                  if name not in self.towers and name not in self.din_towers]
        if unused:
            raise ModelError(
                f"multi_tower_din: feature groups {unused} feed no tower and would be left out "
                f"of the model; add a towers (DEEP) or din_towers (SEQUENCE) entry with that "
                f"input, or remove the group")
        self.final = None
        if config.HasField("final"):
            self.final = MLP(width, mlp_options(config.final, "multi_tower_din.final"))
            width = self.final.output_dim()
        self.output = nn.Linear(width, 1)

    def _check_unique(self, name: str) -> None:
        if name in self.towers or name in self.din_towers:
            raise ModelError(f"multi_tower_din: feature group {name!r} feeds two towers")

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """Each tower's input, then each DIN tower's (query, sequence, lengths)."""
        inputs = [deep_input(self.groups[name], embedded, batch) for name in self.towers]
        for name in self.din_towers:
            inputs.extend(sequence_input(self.groups[name], embedded, batch))
        return tuple(inputs)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Tower outputs -> final MLP -> logits (B,)."""
        count = len(self.towers)
        outputs = [tower(x) for tower, x in zip(self.towers.values(), inputs[:count])]
        for i, attention in enumerate(self.din_towers.values()):
            query, sequence, lengths = inputs[count + 3 * i:count + 3 * i + 3]
            outputs.append(attention(query, sequence, lengths))
        hidden = torch.cat(outputs, dim=-1)
        if self.final is not None:
            hidden = self.final(hidden)
        return self.output(hidden).squeeze(-1)

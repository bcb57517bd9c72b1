"""MultiTower: an MLP tower per DEEP group, then an optional final MLP and one logit.

Every feature group feeds exactly one tower: a group that no tower names is an error
rather than a part of the config that is silently left out.

The towers' outputs are concatenated, passed through the optional ``final`` MLP
and a linear layer to one logit per row (``num_class`` with classes); the prediction is
its sigmoid (their softmax).
``MultiTowerDIN`` is this model with DIN towers over SEQUENCE groups besides.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP
from hashrec.models.group_encoders import input_count
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.rank_model import RankModel
from hashrec.modules import MLP


class MultiTower(RankModel):
    """See the module docstring; arguments as ``RankModel``."""

    # The model_config oneof field this class reads and its tower lists (subclasses
    # add theirs in ``_build_towers`` and ``_tower_outputs``).
    kind = "multi_tower"
    tower_fields = ("towers",)

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = getattr(model_config, self.kind)
        if not any(len(getattr(config, field)) for field in self.tower_fields):
            raise ModelError(f"{self.kind} has no {' and no '.join(self.tower_fields)}")
        self.towers = nn.ModuleDict()
        width = self._build_towers(config)
        unused = [name for name in self.groups if not self._feeds_a_tower(name)]
        if unused:
            raise ModelError(
                f"{self.kind}: feature groups {unused} feed no tower and would be left out "
                f"of the model; add a {self._tower_hint()} entry with that input, or remove "
                f"the group")
        self.final, width = optional_mlp(config, "final", width, f"{self.kind}.final")
        self.output = nn.Linear(width, self.num_class)

    def _build_towers(self, config) -> int:
        """Builds the towers of ``config``; returns the width of their outputs together."""
        width = 0
        for tower in config.towers:
            where = f"{self.kind}.towers[{tower.input!r}]"
            group = self.group(tower.input, DEEP, where)
            self._check_unique(tower.input)
            self.towers[tower.input] = MLP(group.dim, mlp_options(tower.mlp, where + ".mlp"))
            width += self.towers[tower.input].output_dim()
        return width

    def _feeds_a_tower(self, name: str) -> bool:
        return name in self.towers

    def _tower_hint(self) -> str:
        return "towers (DEEP)"

    def _check_unique(self, name: str) -> None:
        if self._feeds_a_tower(name):
            raise ModelError(f"{self.kind}: feature group {name!r} feeds two towers")

    def _tower_groups(self) -> list:
        return [self.groups[name] for name in self.towers]

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """Each MLP tower's input (B, group width), in tower order; a group with sequence
        encoders as the tensors they read (``RankModel.group_inputs``)."""
        return self.group_inputs(self._tower_groups(), embedded, batch)

    def _tower_inputs_count(self) -> int:
        """How many of ``dense_inputs`` the MLP towers take."""
        return sum(input_count(g, self.sequence_encoders) for g in self._tower_groups())

    def _tower_outputs(self, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        groups = self.groups_from_inputs(self._tower_groups(), inputs)
        return [tower(x) for tower, x in zip(self.towers.values(), groups)]

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Tower outputs -> final MLP -> logits (B,), or (B, num_class)."""
        hidden = torch.cat(self._tower_outputs(inputs), dim=-1)
        if self.final is not None:
            hidden = self.final(hidden)
        return self.output(hidden).squeeze(-1)

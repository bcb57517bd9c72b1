"""The match backbone: TorchEasyRec's match (retrieval) model over a configurable backbone
(``match_backbone { backbone { ... } model_params { ... } }``).

The backbone's blocks (``hashrec.models.backbone``) make two towers: its two
``output_blocks`` are the user tower's and the item tower's blocks, told by their names
("user"; "item" or "product"; else first user, then item), and each tower is the blocks,
block packages and feature groups its output block depends on
(``hashrec.models.backbone.towers``). The towers must be apart (no block or feature
group feeds both) so that each runs, trains and exports alone with its own tables; a
config joining them is refused, naming the block that reads the other tower's side.

Each tower's output block gives (B, width); where width differs from
``model_params.output_dim`` (default 64) a linear layer maps it to output_dim (built
with the model, so that the optimizer trains it and the export carries it; TorchEasyRec
creates it at the first forward). COSINE similarity L2-normalizes both embeddings,
INNER_PRODUCT takes them as they are; similarities are divided by ``temperature``.
Negatives, the softmax cross entropy, the output ``similarity`` and recall@k are the
other match models' (``MatchModel``): the sampled items of
``data_config.negative_sampler`` and, with ``model_params.in_batch_negative`` (HashRec's
option), the batch's other items.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.backbone.dag import build_backbone
from hashrec.models.backbone.lambdas import LIST
from hashrec.models.backbone.towers import ITEM, USER, split_towers, tower_config
from hashrec.models.errors import ModelError
from hashrec.models.match import (
    BackboneMatchTower,
    batch_similarity,
    hard_negative_input,
    split_hard_negatives,
)
from hashrec.models.match_model import MatchModel
from hashrec.models.rank_backbone import (
    backbone_input_count,
    backbone_inputs,
    backbone_net_inputs,
)


class MatchBackbone(MatchModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        user_groups, item_groups: each tower's feature groups, in input order.
        user_tower, item_tower: the towers (``BackboneMatchTower``).
        user_block, item_block: the towers' output blocks.
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.match_backbone.backbone
        where = "model_config.match_backbone.backbone"
        parts = split_towers(config, list(self.groups), where)
        towers = {}
        for tower in (USER, ITEM):
            part = parts[tower]
            groups = {name: self.groups[name] for name in part.groups}
            net, used, example = build_backbone(tower_config(config, part), groups, where)
            setattr(self, f"{tower}_groups", [groups[name] for name in used])
            setattr(self, f"{tower}_block", part.block)
            width = _width(example, part.block, tower, where)
            towers[tower] = BackboneMatchTower(net, width, self.output_dim, self.cosine)
        self.user_tower, self.item_tower = towers[USER], towers[ITEM]
        if self.user_tower.dim != self.item_tower.dim:
            raise ModelError(
                f"model_config.match_backbone.model_params.output_dim is 0, which leaves "
                f"the towers' embeddings as their blocks' outputs: {self.user_tower.dim} "
                f"wide ({self.user_block!r}) and {self.item_tower.dim} wide "
                f"({self.item_block!r}), which must be equal; set output_dim")
        self.user_group, self.item_group = self.user_groups[0], self.item_groups[0]
        self._user_inputs = backbone_input_count(self, self.user_groups)

    def tower_groups(self, tower: str) -> list:
        """Every feature group ``tower`` ("user" or "item") reads, in input order."""
        return list(getattr(self, f"{tower}_groups"))

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The user groups' tensors over the batch's B rows, then the item groups' over
        its B + N rows (the sampled negatives' after the batch's items); each group's as
        a backbone reads it (``hashrec.models.rank_backbone.backbone_inputs``)."""
        rows = batch.batch_size
        user = backbone_inputs(self, self.user_groups, embedded, batch)
        item = backbone_inputs(self, self.item_groups, embedded, batch)
        return (*(t[:rows] for t in user), *item, *hard_negative_input(batch))

    def embeddings(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``dense_inputs`` -> (user embeddings (B, D), item embeddings (B + N, D))."""
        at = self._user_inputs
        user = backbone_net_inputs(self, self.user_groups, inputs[:at])
        item = backbone_net_inputs(self, self.item_groups, inputs[at:])
        return self.user_tower(user), self.item_tower(item)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature: (B, 1 + N), or in-batch
        (B, B + N)."""
        inputs, hard = split_hard_negatives(inputs)
        user, item = self.embeddings(*inputs)
        return batch_similarity(user, item, self.in_batch_negative, hard) / self.temperature


def _width(example, block: str, tower: str, where: str) -> int:
    """The width of a tower's output block, whose output must be one (B, D) tensor."""
    if example.kind == LIST:
        raise ModelError(f"{where}.output_blocks: {block!r} (the {tower} tower's) gives a "
                         f"list of {len(example.tensors)} tensors; a tower gives one (B, D) "
                         f"embedding: concatenate them (input_concat_axis) or pick one")
    tensor = example.tensors[0]
    if tensor.dim() != 2:
        shape = " x ".join(map(str, tensor.shape[1:]))
        raise ModelError(f"{where}.output_blocks: {block!r} (the {tower} tower's) gives "
                         f"B x {shape}; a tower gives (B, D) embeddings: flatten or pool it "
                         f"(a lambda block 'lambda x: x.flatten(1)')")
    return int(tensor.shape[-1])

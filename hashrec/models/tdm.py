"""TDM (tree-based deep model): scores (user, tree node) pairs for a layer-wise beam search.

The one SEQUENCE group (the user's behaviour sequence; its query features are the
candidate node's, e.g. its item id, category and brand) goes through a multi-window DIN
encoder (``multiwindow_din``: ``hashrec.modules.MultiWindowDIN``); the other feature
groups (DEEP), as they are, are concatenated to its output, in config order; the
``final`` MLP and a linear layer give one logit per row (``num_class`` with classes), as
TorchEasyRec's TDM. It trains as a ranking model on the rows a ``data_config.tdm_sampler``
makes: each clicked item's ancestors (label 1) and other nodes of the same levels
(label 0). ``item_embedding`` gives a node's query features as the model scores them
(TorchEasyRec's ``TDMEmbedding``), from which ``cluster_tree`` learns a new tree.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, SEQUENCE, query_input, sequence_input
from hashrec.models.mlp_config import mlp_options
from hashrec.models.rank_model import RankModel
from hashrec.modules import MLP, MultiWindowDIN


class TDM(RankModel):
    """See the module docstring; arguments as ``RankModel``."""

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.tdm
        sequences = [n for n, g in self.groups.items() if g.group_type == SEQUENCE]
        if len(sequences) != 1:
            raise ModelError(f"tdm reads one SEQUENCE feature group (the behaviour sequence "
                             f"and the candidate node's features); the config has "
                             f"{len(sequences)}: {sequences}")
        self.sequence_group = sequences[0]
        others = [n for n in self.groups if n != self.sequence_group]
        for name in others:
            self.group(name, DEEP, "tdm")
        self.other_groups = tuple(others)
        group = self.groups[self.sequence_group]
        where = "tdm.multiwindow_din"
        try:
            self.multiwindow_din = MultiWindowDIN(
                group.query_dim, group.sequence_dim, tuple(config.multiwindow_din.windows_len),
                mlp_options(config.multiwindow_din.attn_mlp, where + ".attn_mlp"))
        except ValueError as err:
            raise ModelError(f"{where}: {err}") from err
        width = self.multiwindow_din.output_dim() + sum(self.groups[n].dim for n in others)
        self.final = MLP(width, mlp_options(config.final, "tdm.final"))
        self.output = nn.Linear(self.final.output_dim(), self.num_class)

    def _other_specs(self) -> list:
        return [self.groups[name] for name in self.other_groups]

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The SEQUENCE group's (query, sequence, lengths), then the other groups'
        inputs (``RankModel.group_inputs``)."""
        query, sequence, lengths = sequence_input(self.groups[self.sequence_group],
                                                  embedded, batch)
        return (query, sequence, lengths,
                *self.group_inputs(self._other_specs(), embedded, batch))

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Multi-window DIN output and the other groups -> final MLP -> logits (B,), or
        (B, num_class)."""
        query, sequence, lengths = inputs[:3]
        parts = [self.multiwindow_din(query, sequence, lengths),
                 *self.groups_from_inputs(self._other_specs(), inputs[3:])]
        hidden = torch.cat([p.to(parts[0].dtype) for p in parts], dim=-1)
        return self.output(self.final(hidden)).squeeze(-1)

    def item_embedding(self, batch) -> torch.Tensor:
        """(B, Dq) float32: each row's candidate node's query features (the SEQUENCE
        group's query, as ``dense_inputs`` gives it to the multi-window DIN); the row's
        user-side columns are not read (they may be missing)."""
        return query_input(self.groups[self.sequence_group], self.embed(batch), batch)

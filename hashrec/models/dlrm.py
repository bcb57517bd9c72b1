"""DLRM: pairwise dot interactions of the sparse embeddings and the dense MLP's output.

Groups, as in TorchEasyRec (all DEEP): with one feature group, that group is the
sparse part; with two, the group ``sparse`` is and the group ``dense`` (raw features,
typically) feeds the ``dense_mlp``, whose last layer must have the sparse
features' width d. The sparse group's N features must all have width d. ``bot_mlp``
and ``top_mlp``, the names TorchEasyRec's example dlrm_criteo writes, are second names
of ``dense_mlp`` and ``final`` (``hashrec.config.aliases``).

The interaction takes F vectors of d columns, the dense MLP's output (where there
is a dense group) and then the N sparse features, and gives the dot products of
every pair of them, F * (F - 1) / 2 columns. The final MLP reads the interactions,
then the dense MLP's output, then (``arch_with_sparse``, default true) the sparse
features concatenated; a linear layer gives the logit, whose sigmoid is the
prediction.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.config.aliases import aliased
from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options
from hashrec.models.sparse_dense import (
    dense_mlp_to_width,
    sparse_and_dense_groups,
    sparse_width,
)
from hashrec.modules import MLP, PairwiseDot

# How DLRM's vectors meet, for the width errors.
_DOTS = "interact by dot products"


class DLRMNet(nn.Module):
    """DLRM's dense network, shared by the eager model and its scripted export.

    ``forward([sparse (B, N * d)] or [sparse, dense (B, Dd)]) -> logits (B,)`` (see the
    module docstring); ``dense`` is there with a dense group only.

    Args:
        num_sparse: N.
        dense_mlp: the dense MLP, or None without a dense group.
        final: the final MLP.
        output: the linear layer to the logit (``num_class`` logits with classes).
        arch_with_sparse: the final MLP reads the sparse features too.
    """

    def __init__(self, num_sparse: int, dense_mlp: nn.Module | None, final: nn.Module,
                 output: nn.Module, arch_with_sparse: bool) -> None:
        super().__init__()
        self.num_sparse = num_sparse
        self.has_dense = dense_mlp is not None
        self.dense_mlp = dense_mlp if dense_mlp is not None else nn.Identity()
        self.interaction = PairwiseDot(num_sparse + int(self.has_dense))
        self.final = final
        self.output = output
        self.arch_with_sparse = arch_with_sparse

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        sparse = inputs[0]
        vectors = sparse.reshape(sparse.shape[0], self.num_sparse, -1)
        extra: list[torch.Tensor] = []
        if self.has_dense:
            dense_out = self.dense_mlp(inputs[1])
            vectors = torch.cat([dense_out.unsqueeze(1), vectors], dim=1)
            extra.append(dense_out)
        parts = [self.interaction(vectors)] + extra
        if self.arch_with_sparse:
            parts.append(sparse)
        return self.output(self.final(torch.cat(parts, dim=-1))).squeeze(-1)


class DLRM(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``. The dense network's inputs
    (``input_groups``) are the sparse group and, where there is one, the dense group.

    Attributes:
        sparse_group: the sparse group.
        dense_group: the dense group, or None.
        net: the dense network (``DLRMNet``).
    """

    kind = "dlrm"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dlrm
        self.sparse_group, self.dense_group = sparse_and_dense_groups(self)
        self.input_groups = [self.sparse_group] + (
            [self.dense_group] if self.dense_group is not None else [])
        width = sparse_width(self, _DOTS)
        dense_mlp = dense_mlp_to_width(self, config, width, _DOTS)
        num_vectors = len(self.sparse_group.features) + int(dense_mlp is not None)
        final_width = num_vectors * (num_vectors - 1) // 2
        if dense_mlp is not None:
            final_width += dense_mlp.output_dim()
        if config.arch_with_sparse:
            final_width += self.sparse_group.dim
        if final_width == 0:
            raise ModelError(
                f"{self.kind}: the final MLP would read nothing: the one sparse feature has "
                f"no pair to interact with and arch_with_sparse is false; add features or "
                f"set arch_with_sparse")
        final_config = aliased(config, "final", self.kind, ModelError)
        final = MLP(final_width, mlp_options(final_config, f"{self.kind}.final"))
        self.net = DLRMNet(len(self.sparse_group.features), dense_mlp, final,
                           nn.Linear(final.output_dim(), self.num_class),
                           config.arch_with_sparse)

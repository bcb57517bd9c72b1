"""DeepFM: WideAndDeep plus a factorization machine over the features' embeddings.

The wide logit and the deep MLP are WideAndDeep's (WIDE groups embedded in wide
tables of ``wide_embedding_dim`` columns and summed; DEEP groups concatenated
through the ``deep`` MLP). The factorization machine reads N features of one width
d, the DEEP group named ``fm`` where there is one (as in TorchEasyRec; that group
then feeds only the factorization machine) or else the deep MLP's features, and
gives their pairwise interactions, sum over i < j of x_i * x_j, (B, d). Features of
different widths (raw features among embeddings, or two embedding_dims) are an
error.

Without ``final`` the logit is the wide logit + the interactions summed over d +
a linear layer over the deep MLP's output; with ``final`` the wide logit, the
interactions and the deep output, concatenated (1 + d + deep width), go through
the final MLP and then the linear layer.
"""

from __future__ import annotations

from hashrec.models.errors import ModelError
from hashrec.models.wide_and_deep import WideAndDeep


class DeepFM(WideAndDeep):
    """See the module docstring; arguments as ``RankModel``."""

    kind = "deepfm"
    fm_group_name = "fm"

    def _fm_layout(self) -> tuple[int, int]:
        group = self.fm_group if self.fm_group is not None else self.deep_group
        widths = {f.dim for f in group.features}
        if len(widths) > 1:
            source = "feature group 'fm'" if self.fm_group is not None else \
                "the DEEP groups (no DEEP group named 'fm')"
            listed = ", ".join(f"{f.name} {f.dim}" for f in group.features)
            raise ModelError(
                f"{self.kind}: the factorization machine reads {source}, whose features "
                f"have widths {listed}; it needs one width: give them one embedding_dim, "
                f"or list the features it should pair in a DEEP group named 'fm'")
        return len(group.features), widths.pop()

"""The feature groups of the models that stack embeddings as rows of one width (DLRM,
WuKong), as TorchEasyRec reads them: all DEEP; with one group, that group is the sparse
part; with two, the group ``sparse`` is and the group ``dense`` (raw features,
typically) feeds the model's ``dense_mlp``, whose output is one more row of the sparse
features' width."""

from __future__ import annotations

from hashrec.config.aliases import aliased
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, GroupSpec
from hashrec.models.mlp_config import mlp_options
from hashrec.modules import MLP

SPARSE = "sparse"
DENSE = "dense"


def sparse_and_dense_groups(model) -> tuple[GroupSpec, GroupSpec | None]:
    """(the sparse group, the dense group or None) of ``model`` (its ``groups`` and
    ``kind``).

    Raises:
        ModelError: a group that is not DEEP, or several groups other than exactly
            ``sparse`` and ``dense``.
    """
    kind = model.kind
    for name, group in model.groups.items():
        if group.group_type != DEEP:
            raise ModelError(f"{kind}: feature group {name!r} is {group.group_type}; "
                             f"{kind} reads DEEP groups")
    if len(model.groups) == 1:
        return next(iter(model.groups.values())), None
    unknown = [name for name in model.groups if name not in (SPARSE, DENSE)]
    if unknown or SPARSE not in model.groups:
        raise ModelError(
            f"{kind} with several feature groups reads the group {SPARSE!r} (the "
            f"embeddings that interact) and the group {DENSE!r} (the dense MLP's input); "
            f"got groups {list(model.groups)}")
    return model.groups[SPARSE], model.groups[DENSE]


def sparse_width(model, why: str) -> int:
    """The one width of ``model.sparse_group``'s features; ``why`` says, for the error,
    how they meet (e.g. "interact by dot products").

    Raises:
        ModelError: features of different widths, each named with its width.
    """
    group = model.sparse_group
    widths = {f.dim for f in group.features}
    if len(widths) > 1:
        listed = ", ".join(f"{f.name} {f.dim}" for f in group.features)
        raise ModelError(f"{model.kind}: the features of the sparse group {group.name!r} "
                         f"{why} and need one width; they have {listed}")
    return widths.pop()


def dense_mlp_to_width(model, config, width: int, why: str) -> MLP | None:
    """The ``dense_mlp`` of the model message ``config`` over ``model.dense_group``, its
    output ``width`` wide; None without a dense group.

    Raises:
        ModelError: a dense_mlp without a dense group, a dense group without one, or a
            last hidden unit other than ``width``.
    """
    where = f"{model.kind}.dense_mlp"
    dense_config = aliased(config, "dense_mlp", model.kind, ModelError)
    if model.dense_group is None:
        if dense_config is not None:
            raise ModelError(f"{where} is set but there is no feature group {DENSE!r} "
                             f"(beside the group {SPARSE!r}) for it to read")
        return None
    if dense_config is None:
        raise ModelError(f"{where} is needed for the feature group {DENSE!r}; set it, "
                         f"its last hidden unit {width} (the sparse features' width)")
    mlp = MLP(model.dense_group.dim, mlp_options(dense_config, where))
    if mlp.output_dim() != width:
        raise ModelError(
            f"{where}.hidden_units ends in {mlp.output_dim()}; the dense MLP's output and "
            f"the sparse features {why}, which needs their width {width} as its last "
            f"hidden unit")
    return mlp

"""WIDE feature groups: a narrow table of its own per feature table (the wide part).

As in TorchEasyRec, a sparse feature that a WIDE feature group names is embedded in
the wide table ``<table>_wide`` of its table ``<table>`` (``embedding_name`` or the
feature name): ``wide_embedding_dim`` columns (the model's setting, 4 by default),
the rows, zch or dynamicemb options of ``<table>``, and values and training of its
own. Features that share a table share its wide table. A feature in a WIDE and a
DEEP group is therefore looked up twice, in ``<table>`` for the deep part and in
``<table>_wide`` for the wide part; one that only WIDE groups name is not looked up
in ``<table>`` at all (a table no other feature reads is left out).

The wide embedding of feature ``f`` is the embedding output ``f@wide``
(:func:`wide_name`); its spec reads the ids of ``f`` itself
(``EmbeddingFeatureSpec.key``), so inputs hold each feature once. Dynamic wide tables
of one WIDE group share a storage, as a DEEP group's dynamic tables do.

``wide_init_fn`` sets how the wide tables' rows start, in TorchEasyRec's form
(``nn.init.uniform_,a=-0.01,b=0.01``; the functions of ``hashrec.features.init_fn``);
without it a wide table starts as its feature's table does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hashrec.config.errors import ConfigError
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.features.base import Feature
from hashrec.features.init_fn import parse_init_fn
from hashrec.table.options import InitializerArgs

WIDE_GROUP = 1  # FeatureGroupType.WIDE
DEFAULT_WIDE_DIM = 4
TABLE_SUFFIX = "_wide"
def wide_name(feature: str) -> str:
    """The embedding output name of ``feature``'s wide embedding."""
    return f"{feature}@wide"


@dataclass(frozen=True)
class WideEmbeddings:
    """The wide tables of a model's WIDE feature groups and the specs reading them.

    Attributes:
        tables: the wide tables, in first-use order.
        features: one spec per feature that a WIDE group names, ``wide_name(feature)``.
        dim: their dimension (``wide_embedding_dim``).
        wide_only: features that only WIDE groups name: not looked up in their own table.
    """

    tables: tuple[EmbeddingTableSpec, ...] = ()
    features: tuple[EmbeddingFeatureSpec, ...] = ()
    dim: int = DEFAULT_WIDE_DIM
    wide_only: frozenset[str] = frozenset()


def build_wide_embeddings(features: list[Feature], tables: list[EmbeddingTableSpec],
                          model_config) -> WideEmbeddings:
    """The wide tables and specs of ``model_config``'s WIDE groups (see the module
    docstring). A name in a WIDE group that is not a pooled sparse feature gets nothing
    here: the model names that problem when it builds the group.

    Raises:
        ConfigError: a bad ``wide_embedding_dim`` or ``wide_init_fn``, or a wide table or
            output name that a configured table or feature already has.
    """
    groups = [g for g in model_config.feature_groups if g.group_type == WIDE_GROUP] \
        if model_config is not None else []
    if not groups:
        return WideEmbeddings()
    dim, initializer = _wide_settings(model_config)
    sparse = {f.name: f for f in features if f.is_sparse and not f.is_sequence}
    own = {spec.name: spec for spec in tables}
    readers: dict[str, list[str]] = {}   # wide table -> the wide specs reading it
    owners: dict[str, set[str]] = {}     # wide table -> the WIDE groups naming its readers
    specs: dict[str, EmbeddingFeatureSpec] = {}
    for group in groups:
        for name in group.feature_names:
            if name not in sparse:
                continue
            feature = sparse[name]
            table = feature.table.name + TABLE_SUFFIX
            owners.setdefault(table, set()).add(group.group_name)
            if wide_name(name) not in specs:
                specs[wide_name(name)] = EmbeddingFeatureSpec(
                    wide_name(name), table, feature.pooling, weighted=feature.weighted,
                    key=name)
                readers.setdefault(table, []).append(wide_name(name))
    _check_names(readers, specs, own, {f.name for f in features})
    wide_tables = tuple(
        _wide_table(own[table[:-len(TABLE_SUFFIX)]], table, dim, initializer,
                    tuple(readers[table]),
                    next(iter(owners[table])) if len(owners[table]) == 1 else None)
        for table in readers)
    other = {name for g in model_config.feature_groups if g.group_type != WIDE_GROUP
             for name in g.feature_names}
    wide_only = frozenset(spec.key for spec in specs.values() if spec.key not in other)
    return WideEmbeddings(wide_tables, tuple(specs.values()), dim, wide_only)


def _check_names(readers: dict[str, list[str]], specs: dict[str, EmbeddingFeatureSpec],
                 own: dict[str, EmbeddingTableSpec], features: set[str]) -> None:
    for table, names in readers.items():
        if table in own:
            raise ConfigError(f"feature {specs[names[0]].key!r} is in a WIDE feature group, "
                              f"whose wide table {table!r} has the name of a configured "
                              f"table; rename that table (embedding_name)")
    for name, spec in specs.items():
        if name in features:
            raise ConfigError(f"feature name {name!r} is the name of the wide embedding of "
                              f"feature {spec.key!r} (in a WIDE feature group); rename it")


def _wide_table(own: EmbeddingTableSpec, name: str, dim: int,
                initializer: InitializerArgs | None, readers: tuple[str, ...],
                fusion_group: str | None) -> EmbeddingTableSpec:
    """The wide table ``name`` of table ``own``: its rows or options at ``dim`` columns."""
    if own.dynamic is None:
        return dataclasses.replace(own, name=name, dim=dim, features=readers,
                                   initializer=initializer or own.initializer)
    options = dataclasses.replace(own.dynamic, dim=dim, name=name,
                                  initializer=initializer or own.dynamic.initializer)
    return dataclasses.replace(own, name=name, dim=dim, dynamic=options, features=readers,
                               fusion_group=fusion_group)


def _wide_settings(model_config) -> tuple[int, InitializerArgs | None]:
    """(wide_embedding_dim, the wide_init_fn initializer or None) of the model; a model
    without these fields gets the default dimension."""
    kind = model_config.WhichOneof("model")
    model = getattr(model_config, kind) if kind else None
    if kind in ("rank_backbone", "multi_task_backbone", "match_backbone"):
        return _backbone_wide_dim(model.backbone, f"model_config.{kind}.backbone"), None
    fields = model.DESCRIPTOR.fields_by_name if model is not None else {}
    if "wide_embedding_dim" not in fields:
        return DEFAULT_WIDE_DIM, None
    where = f"model_config.{kind}"
    if model.wide_embedding_dim < 1:
        raise ConfigError(f"{where}.wide_embedding_dim is {model.wide_embedding_dim}; allowed: "
                          f"1 or more columns (leave it out for {DEFAULT_WIDE_DIM})")
    initializer = None
    if model.wide_init_fn:
        initializer = parse_init_fn(model.wide_init_fn, f"{where}.wide_init_fn")
    return int(model.wide_embedding_dim), initializer


def _backbone_wide_dim(backbone, where: str) -> int:
    """A backbone's wide embedding width: its input_layer blocks' ``wide_output_dim``
    (one value), else the default.

    Raises:
        ConfigError: two different values, or 0.
    """
    dims = {block.input_layer.wide_output_dim for block in backbone.blocks
            if block.WhichOneof("layer") == "input_layer"
            and block.input_layer.HasField("wide_output_dim")}
    if len(dims) > 1:
        raise ConfigError(f"{where}: input_layer blocks set wide_output_dim {sorted(dims)}; "
                          f"the wide embeddings have one width: set one value")
    dim = dims.pop() if dims else DEFAULT_WIDE_DIM
    if dim < 1:
        raise ConfigError(f"{where}: input_layer wide_output_dim is 0; allowed: 1 or more")
    return int(dim)

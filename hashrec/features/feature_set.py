"""FeatureSet: the features a model reads, their tables, and parsing of input blocks into
Batches.

Like TorchEasyRec, a model reads only the features its ``feature_groups`` name: a
configured feature that no group names is still built (its config is checked) but left
out of the set, so its columns are not read or parsed, its ids are not looked up, and
no table exists for it unless a feature that is grouped reads the same table (a
sequence sub-feature sharing a top-level feature's table, or a shared
``embedding_name``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from hashrec.config.errors import ConfigError
from hashrec.config.fg_mode import RAW, fg_input
from hashrec.config.sequence_groups import group_feature_names
from hashrec.config.validate import MATCH_MODELS, feature_problems
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec, items_key
from hashrec.features.base import Feature, SparseIds, check_not_sequence
from hashrec.features.batch import Batch
from hashrec.features.combo_feature import build_combo_feature
from hashrec.features.encoded import encoded_column_notes, read_as_generated
from hashrec.features.errors import FeatureError
from hashrec.features.generated import GENERATED_KINDS, build_generated_feature
from hashrec.features.id_feature import IdFeature, build_id_feature
from hashrec.features.raw_feature import build_raw_feature
from hashrec.features.sampled_rows import parse_with_negatives
from hashrec.features.sequence_feature import (
    build_sequence_group,
    build_top_level_sequence,
    note_sequence_defaults,
    parse_sequence,
)
from hashrec.features.sequence_labels import (
    SEQUENCE_LABEL_MODELS,
    SequenceLabel,
    read_sequence_label,
    sequence_labels,
)
from hashrec.features.tables import alias_emb_names, build_tables, tables_read_by
from hashrec.features.tokens import empty_as_null, first_not_converting, get_column
from hashrec.features.wide import WideEmbeddings, build_wide_embeddings

logger = logging.getLogger("hashrec.features")


class FeatureSet:
    """The features of a pipeline config and how input rows become a Batch.

    Args:
        features: features in config order (sequence sub-features in place).
        tables: the embedding tables they read.
        label_fields: label columns.
        binary_labels: label columns whose values must be in [0, 1] (those a binary
            cross-entropy or focal loss trains on: 0/1, or soft labels) -> that loss,
            named by the error.
        class_labels: label column -> C, for the columns whose values must be class ids
            0 .. C-1 (those a task of C > 1 classes trains on; the fewest classes where
            tasks of several counts read one column).
        domain_label: (column, K) of a PEPNet's towers per domain (``domain_input_name``,
            ``task_domain_num``): the label column of each row's domain, whose values must
            be ids 0 .. K-1; it may be a feature's input too (it picks a tower, it is not
            a target).
        sample_weight_fields: columns of row loss weights (finite, >= 0): a task's
            ``sample_weight_name``, or the first for a task without one. Read, like the
            labels, only where labels are (``parse(with_labels=True)``), into
            ``Batch.labels`` under their names.
        left_out: configured features that are not in the set (no feature group names
            them), in config order.
        unembedded: id features parsed into the batch but not embedded (a grouped_auc
            metric's grouping key or a jrc_loss's session feature that no feature group
            names): no table, no lookup.
        wide: the wide tables of the model's WIDE feature groups and the specs reading
            them (``hashrec.features.wide``); ``tables`` are the others.
        column_notes: input column -> why a feature reads it, where the reason is not the
            column its expression names (input a feature generation encoded), for the
            error of a file without it.
        read_labels: read the label columns (False: a model whose loss reads no label
            value, hstu_match; the sample weights are still read).
    """

    def __init__(self, features: list[Feature], tables: list[EmbeddingTableSpec],
                 label_fields: list[str],
                 binary_labels: Mapping[str, str] | None = None,
                 sample_weight_fields: Iterable[str] = (),
                 left_out: tuple[str, ...] = (), unembedded: tuple[str, ...] = (),
                 wide: WideEmbeddings | None = None,
                 class_labels: dict[str, int] | None = None,
                 column_notes: Mapping[str, str] | None = None,
                 domain_label: tuple[str, int] | None = None,
                 read_labels: bool = True,
                 sequence_labels: Mapping[str, SequenceLabel] | None = None) -> None:
        self.column_notes = dict(column_notes or {})
        self._tables = list(tables)
        self._wide = wide or WideEmbeddings()
        self._wide_names = frozenset(spec.name for spec in self._wide.features)
        self.label_fields = list(label_fields)
        self.binary_losses = dict(binary_labels or {})
        self.class_labels = dict(class_labels or {})
        self.domain_label = domain_label
        self.sample_weight_fields = tuple(sample_weight_fields)
        # Whether the label columns are read (a model whose loss reads none, hstu_match,
        # reads the sample weights alone).
        self.read_labels = read_labels
        # Label columns of a list a row (dlrm_hstu's, one value per candidate): how each
        # is read (hashrec.features.sequence_labels).
        self.sequence_labels = dict(sequence_labels or {})
        # Columns read only with the labels: the labels and the sample weights.
        self.target_columns = (self.label_fields if read_labels else []) \
            + list(self.sample_weight_fields)
        self.left_out = tuple(left_out)
        self.unembedded = frozenset(unembedded)
        self._index(features)

    def _index(self, features: list[Feature]) -> None:
        """What the set derives from its ``features``: their lookup by name, the sparse
        keys, the sequences parsed together and the columns read."""
        self.features = {f.name: f for f in features}
        self._sparse = [f for f in features if f.is_sparse]
        # multi-value sequences' item sizes follow every feature's ids (``items_key``)
        self._multi = [f.name for f in self._sparse if getattr(f, "multi_value", False)]
        taken = [items_key(n) for n in self._multi if items_key(n) in self.features]
        if taken:
            raise ConfigError(f"feature {taken[0]!r}: the name is taken by the item sizes of "
                              f"sequence {taken[0][:-len(items_key(''))]!r} (value_dim 0); "
                              f"rename the feature")
        self._sparse_keys = [f.name for f in self._sparse] + [items_key(n) for n in self._multi]
        by_sequence: dict[str, list[Feature]] = {}
        for f in features:  # a sub-feature's sequence is its sequence_feature, never itself
            if f.is_sequence and f.sequence_name != f.name:
                by_sequence.setdefault(f.sequence_name, []).append(f)
        # sequences of several sub-features, parsed together (``parse_sequence``)
        self._sequences = [group for group in by_sequence.values() if len(group) > 1]
        columns = [c for f in features for c in f.columns]
        self.feature_columns = list(dict.fromkeys(columns))
        self.input_columns = list(dict.fromkeys(self.feature_columns + self.target_columns))

    def reading(self, columns: Mapping[str, str]) -> FeatureSet:
        """This set with each feature that ``columns`` names (feature name -> input column)
        reading that column instead of its own, parsed as before; all else alike.

        Raises:
            ValueError: a name that is no feature of the set.
        """
        unknown = [name for name in columns if name not in self.features]
        if unknown:
            raise ValueError(f"features {unknown} are not in the set ({list(self.features)})")
        features = []
        for feature in self.features.values():
            if feature.name in columns:
                feature = copy.copy(feature)
                feature.columns = (columns[feature.name],)
            features.append(feature)
        moved = copy.copy(self)
        moved.column_notes = dict(self.column_notes)
        moved._index(features)
        return moved

    @property
    def binary_labels(self) -> frozenset[str]:
        """The label columns whose values must be in [0, 1]."""
        return frozenset(self.binary_losses)

    def embedding_tables(self) -> list[EmbeddingTableSpec]:
        """The features' tables, then the wide tables."""
        return self._tables + list(self._wide.tables)

    def embedding_features(self) -> list[EmbeddingFeatureSpec]:
        """One spec per embedded KeyedJaggedTensor key, in key order, except the features
        that only WIDE groups read; then one per feature of a WIDE group (its wide
        embedding)."""
        return [EmbeddingFeatureSpec(f.name, f.table.name, f.pooling, f.is_sequence,
                                     f.sequence_length, f.weighted,
                                     multi_value=f.name in self._multi) for f in self._sparse
                if f.name not in self.unembedded and f.name not in self._wide.wide_only] \
            + list(self._wide.features)

    def sparse_keys(self) -> list[str]:
        """The keys of a parsed Batch's ``sparse``, in order: every sparse feature in
        feature order, then the item sizes of multi-value sequences (``items_key``)."""
        return list(self._sparse_keys)

    def id_features(self) -> list[str]:
        """The non-sequence sparse features parsed into the batch, embedded or not."""
        return [f.name for f in self._sparse if not f.is_sequence]

    def dense_features(self) -> dict[str, int]:
        """Raw features without boundaries (not sequences): name -> value_dim."""
        return {f.name: f.value_dim for f in self.features.values()
                if not f.is_sparse and not f.is_sequence}

    def sequence_dense_features(self) -> dict[str, int]:
        """Sequence raw features without boundaries: name -> value_dim (per item)."""
        return {f.name: f.value_dim for f in self.features.values()
                if not f.is_sparse and f.is_sequence}

    def sequence_names(self) -> dict[str, str]:
        """Sequence features (sparse and dense): name -> the sequence whose items they read
        (their ``sequence_feature``'s name; a top-level sequence feature's own name)."""
        return {f.name: f.sequence_name for f in self.features.values() if f.is_sequence}

    def output_dim(self, feature_name: str) -> int:
        """Width of a feature's (or a wide embedding's) contribution to a feature group."""
        if feature_name in self._wide_names:
            return self._wide.dim
        if feature_name not in self.features:
            raise ConfigError(f"feature {feature_name!r} is not configured (features: "
                              f"{', '.join(self.features)})")
        return self.features[feature_name].output_dim

    def parse(self, table: pa.Table | pa.RecordBatch, with_labels: bool = True,
              negatives: pa.Table | None = None, hard_negatives=None) -> Batch:
        """Turn one block of rows into a Batch (sparse ids, dense values, labels);
        ``negatives``: sampled item rows (``table``'s columns) whose features follow the
        block's (``Batch.negatives``), without labels; ``hard_negatives``: (B, H) bool
        numpy mask of the hard-negative slots among them (``Batch.hard_negatives``)."""
        batch_size = table.num_rows
        labeled = table
        if negatives is not None:
            head = table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
            table = pa.concat_tables([head, negatives]).combine_chunks()
        values, lengths, weights = [], [], []
        dense, sequence_dense = {}, {}
        weighted = any(f.weighted for f in self._sparse)
        outputs = {}
        for group in self._sequences:
            outputs.update(parse_sequence(group, table))
        items = []
        for feature in self.features.values():
            out = outputs[feature.name] if feature.name in outputs else \
                parse_with_negatives(feature, table, batch_size, negatives)
            if isinstance(out, SparseIds):
                values.append(out.values)
                lengths.append(out.lengths)
                if weighted:
                    weights.append(out.weights if out.weights is not None
                                   else np.ones(len(out.values), dtype=np.float32))
                if out.values_per_item is not None:
                    items.append(out)
            elif feature.is_sequence:
                sequence_dense[feature.name] = torch.from_numpy(out)
            else:
                dense[feature.name] = torch.from_numpy(out)
        for out in items:  # the item sizes of multi-value sequences, keyed ``items_key``
            values.append(out.values_per_item)
            lengths.append(out.items_per_row)
            if weighted:
                weights.append(np.ones(len(out.values_per_item), dtype=np.float32))
        # Every feature returns int64 ids and non-negative lengths summing to its id
        # count, so the layout is consistent by construction: no validation pass.
        sparse = KeyedJaggedTensor(
            self._sparse_keys,
            torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, np.int64)),
            torch.from_numpy(np.concatenate(weights)) if weighted else None, validate=False)
        labels = self._labels(labeled) if with_labels else {}
        return Batch(sparse, dense, sequence_dense, labels, batch_size,
                     negatives=0 if negatives is None else negatives.num_rows,
                     hard_negatives=None if hard_negatives is None
                     else torch.from_numpy(np.ascontiguousarray(hard_negatives)))

    def _labels(self, table) -> dict[str, torch.Tensor]:
        labels = {name: self._label(_decoded(get_column(table, name, f"label {name}")), name)
                  for name in (self.label_fields if self.read_labels else [])}
        for weight in self.sample_weight_fields:
            column = get_column(table, weight, f"sample weight {weight}")
            labels[weight] = self._weight(_decoded(column), weight)
        return labels

    @staticmethod
    def _weight(array: pa.Array, name: str) -> torch.Tensor:
        """The sample weight column (numbers, or their texts) as (B,) float32; FeatureError
        naming the first bad row."""
        numbers = array
        if _is_text(array.type):
            numbers = _text_numbers(array, f"sample weight column {name!r}")
        elif not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
            raise FeatureError(f"sample weight column {name!r} has type {array.type}; "
                               f"expected numbers")
        values = pc.cast(numbers, pa.float32()).to_numpy(zero_copy_only=False).copy()
        bad = ~(np.isfinite(values) & (values >= 0))  # NaN (nulls included) fails both
        if numbers.null_count:
            bad |= pc.is_null(numbers).to_numpy(zero_copy_only=False)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise FeatureError(f"sample weight column {name!r}", row,
                               f"value {array[row].as_py()!r} is not a finite weight >= 0")
        return torch.from_numpy(values)

    def _label(self, array: pa.Array, name: str) -> torch.Tensor:
        """One label column (numbers, booleans, or their texts) as (B,) float32, or one of
        a list a row (``sequence_labels``) as (B, K); FeatureError naming the first bad
        row."""
        if name in self.sequence_labels:
            return read_sequence_label(array, name, self.sequence_labels[name])
        numbers = array
        if _is_text(array.type):
            numbers = _text_numbers(array, f"label column {name!r}", booleans=True)
        elif not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)
                  or pa.types.is_boolean(array.type)):
            raise FeatureError(f"label column {name!r} has type {array.type}; expected "
                               f"numbers")
        if numbers.null_count:
            row = int(np.flatnonzero(pc.is_null(numbers).to_numpy(zero_copy_only=False))[0])
            raise FeatureError(f"label column {name!r}", row, "the label is null")
        values = pc.cast(numbers, pa.float32()).to_numpy(zero_copy_only=False).copy()
        loss = self.binary_losses.get(name)
        if loss is not None:
            _check_label(array, name, ~((values >= 0) & (values <= 1)),  # NaN included
                         f"is not in [0, 1]; {loss} trains on labels in [0, 1] (0/1, or "
                         f"a soft label such as a rate; fix the data or choose another "
                         f"label column)")
        classes = self.class_labels.get(name)
        if classes is not None:  # NaN fails every comparison, so it is bad too
            _check_label(array, name,
                         ~((values >= 0) & (values < classes) & (np.floor(values) == values)),
                         f"is not a class id in [0, {classes}); a task of num_class "
                         f"{classes} trains on the class ids 0 to {classes - 1} (fix the "
                         f"data, or the num_class)")
        if self.domain_label is not None and name == self.domain_label[0]:
            domains = self.domain_label[1]
            _check_label(array, name,
                         ~((values >= 0) & (values < domains) & (np.floor(values) == values)),
                         f"is not a domain index in [0, {domains}); pepnet.domain_input_name "
                         f"reads each row's domain, an id 0 to {domains - 1} "
                         f"(pepnet.task_domain_num {domains}; fix the data, or "
                         f"task_domain_num)")
        # A regression label (l2_loss), or one no loss reads: NaN or inf would make the
        # loss NaN, a divergence at the next log line that names no row.
        _check_label(array, name, ~np.isfinite(values),
                     "is not a finite number; a label must be finite (fix the data)")
        return torch.from_numpy(values)


def _check_label(array: pa.Array, name: str, bad: np.ndarray, why: str) -> None:
    """FeatureError naming the first row of label column ``name`` that ``bad`` marks."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise FeatureError(f"label column {name!r}", row,
                           f"value {array[row].as_py()!r} {why}")


def _decoded(array: pa.Array) -> pa.Array:
    """A dictionary-encoded column (pandas' categoricals) as its values' type."""
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


# The texts of booleans that a label may hold (those pyarrow's CSV reader takes).
_TRUE_TEXTS, _FALSE_TEXTS = ["true", "True", "TRUE"], ["false", "False", "FALSE"]


def _text_numbers(array: pa.Array, subject: str, booleans: bool = False) -> pa.Array:
    """A text column (a CSV column without a type) as float64: an empty cell is null and,
    with ``booleans``, true/false texts are 1/0. FeatureError naming the first cell that
    is not a number."""
    text = empty_as_null(array)
    if booleans:
        for texts, number in ((_TRUE_TEXTS, "1"), (_FALSE_TEXTS, "0")):
            text = pc.if_else(pc.is_in(text, value_set=pa.array(texts, array.type)),
                              pa.scalar(number, array.type), text)
    try:
        return pc.cast(text, pa.float64())
    except pa.ArrowInvalid:
        row = first_not_converting(text, pa.float64())
    raise FeatureError(subject, row, f"value {array[row].as_py()!r} is not a number")


def _build(kind: str, cfg, top_level: dict[str, IdFeature]) -> list[Feature]:
    if kind == "id_feature":
        return [top_level[cfg.feature_name]]
    if kind == "raw_feature":
        check_not_sequence(cfg, kind)
        return [build_raw_feature(cfg)]
    if kind == "combo_feature":
        return [build_combo_feature(cfg)]
    if kind == "sequence_feature":
        return build_sequence_group(cfg, top_level)
    if kind in GENERATED_KINDS:
        return [build_generated_feature(kind, cfg)]
    return [build_top_level_sequence(kind, cfg, top_level)]


def build_feature_set(pipeline_config, keep: Iterable[str] = (),
                      metric_keys: bool = True) -> FeatureSet:
    """Build the FeatureSet of a pipeline config (EasyRecConfig): the features its
    ``model_config.feature_groups`` name (every feature where no group is configured).

    Args:
        pipeline_config: the EasyRecConfig.
        keep: feature names kept although no feature group names them (an inference
            model exported before such features were left out still reads them).
        metric_keys: the grouped_auc metrics' grouping keys and the jrc_loss session
            features are parsed too, and those no group names are not embedded
            (``FeatureSet.unembedded``); False (prediction, which computes no metric and
            no loss) leaves them out like any ungrouped feature.

    Raises:
        ConfigError: an unsupported feature kind or option, a feature without
            bucketization, duplicate names, or tables that features share
            inconsistently.
    """
    problems = feature_problems(pipeline_config)
    if problems:
        raise ConfigError("feature configs use what HashRec does not support:\n  "
                          + "\n  ".join(problems))
    configs = [(fc.WhichOneof("feature"), getattr(fc, fc.WhichOneof("feature")))
               for fc in pipeline_config.feature_configs]
    top_level = {cfg.feature_name: build_id_feature(cfg)
                 for kind, cfg in configs if kind == "id_feature"}
    features: list[Feature] = []
    for kind, cfg in configs:
        features += _build(kind, cfg, top_level)
    data_config = pipeline_config.data_config if pipeline_config.HasField("data_config") \
        else None
    if fg_input(data_config) == RAW:  # encoded input's missing items are no "0"
        note_sequence_defaults(configs)
    notes = encoded_column_notes(features, data_config)
    features = read_as_generated(features, configs, data_config)
    labels = list(pipeline_config.data_config.label_fields)
    weights = _sample_weight_fields(pipeline_config.data_config, labels)
    model_config = pipeline_config.model_config if pipeline_config.HasField("model_config") \
        else None
    domain = _domain_label(model_config)
    _check_names(features, [name for name in labels if domain is None or name != domain[0]],
                 weights)
    # Tables come from every feature, so that features sharing a table are checked to
    # agree whether or not a group names them; only the tables read are kept.
    for name, table in alias_emb_names(features).items():
        logger.info("feature %r: embedding_name %r is feature %r's own table (TorchEasyRec's "
                    "name for it), shared", name, f"{table}_emb", table)
    tables = build_tables(features, model_config)
    read = _read_features(model_config, keep)
    keys = _label_keys(model_config) if metric_keys and read is not None else set()
    kept = [f for f in features if read is None or f.name in read or f.name in keys]
    unembedded = tuple(f.name for f in kept if read is not None and f.name not in read)
    left_out = tuple(f.name for f in features if f not in kept)
    wide = build_wide_embeddings(features, tables, model_config)
    # Features only WIDE groups name read their wide table alone.
    embedded = {f.name for f in kept} - set(unembedded) - wide.wide_only
    # hstu_match's loss reads none of the labels' values (TorchEasyRec's, candidate
    # sequences such as cand_seq__action_weight, are not read either)
    read_labels = model_config is None or model_config.WhichOneof("model") != "hstu_match"
    return FeatureSet(kept, tables_read_by(tables, embedded), labels,
                      _binary_labels(labels, model_config), weights, left_out, unembedded,
                      wide, _class_labels(labels, model_config), notes, domain,
                      read_labels=read_labels,
                      sequence_labels=sequence_labels(model_config, features, labels))


def _sample_weight_fields(data_config, label_fields: list[str]) -> tuple[str, ...]:
    """``data_config.sample_weight_fields``, checked: no label field, no column twice."""
    fields = tuple(data_config.sample_weight_fields)
    for name in fields:
        if name in label_fields:
            raise ConfigError(f"data_config.sample_weight_fields: {name!r} is a label field; "
                              f"give the column of each row's loss weight")
        if fields.count(name) > 1:
            raise ConfigError(f"data_config.sample_weight_fields lists {name!r} twice; "
                              f"list each column once")
    return fields


def _read_features(model_config, keep: Iterable[str]) -> frozenset[str] | None:
    """Names the model's feature groups list (their sequence groups' too), plus ``keep``;
    None (every feature) where there is no model config or it has no feature group."""
    if model_config is None or not model_config.feature_groups:
        return None
    return frozenset(name for group in model_config.feature_groups
                     for name in group_feature_names(group)).union(keep)


def _label_keys(model_config) -> set[str]:
    """The features the grouped_auc and grouped_xauc metrics group rows by and those the
    jrc_loss losses read sessions from (a multi-task model's metrics and losses are its task
    towers')."""
    towers = _task_towers(model_config)
    holders = [model_config] if towers is None else list(towers)
    keys = {getattr(m, m.WhichOneof("metric")).grouping_key for h in holders
            for m in h.metrics if m.WhichOneof("metric") in ("grouped_auc", "grouped_xauc")}
    return keys | {loss.jrc_loss.session_name for h in holders for loss in h.losses
                   if loss.WhichOneof("loss") == "jrc_loss"}


def _task_towers(model_config):
    """A multi-task model's ``task_towers`` (told by the field, so that the feature layer
    needs no import of the models layer), or None for a single-task model."""
    kind = model_config.WhichOneof("model")
    model = getattr(model_config, kind) if kind else None
    if model is not None and "task_towers" in model.DESCRIPTOR.fields_by_name:
        return model.task_towers
    if model is not None and "fusion_mtl_tower" in model.DESCRIPTOR.fields_by_name:
        return model.fusion_mtl_tower.task_configs
    return None


def _binary_labels(label_fields: list[str], model_config) -> dict[str, str]:
    """The label columns a binary loss (cross entropy or focal) trains on -> that loss
    (the first, where tasks of two read one column): a single-task model's loss reads
    ``label_fields[0]``, a multi-task model's each task's ``label_name``, and a model or
    task without ``losses`` uses binary_cross_entropy."""
    if not label_fields or model_config is None \
            or model_config.WhichOneof("model") in MATCH_MODELS:  # their loss reads no label
        return {}
    if model_config.WhichOneof("model") in SEQUENCE_LABEL_MODELS:
        # a list a row, each value an action bitmask or a number (the model reads them)
        return {}
    towers = _task_towers(model_config)
    pairs = [(label_fields[0], _binary_loss(model_config.losses))] if towers is None else \
        [(_tower_label(t, i, label_fields), _binary_loss(t.losses))
         for i, t in enumerate(towers)]
    out: dict[str, str] = {}
    for name, loss in pairs:
        if loss and name in label_fields:
            out.setdefault(name, loss)
    return out


def _class_labels(label_fields: list[str], model_config) -> dict[str, int]:
    """The label columns of the tasks of C > 1 classes -> C (the fewest where tasks of
    several counts read one column)."""
    if not label_fields or model_config is None \
            or model_config.WhichOneof("model") in SEQUENCE_LABEL_MODELS:
        return {}
    towers = _task_towers(model_config)
    if towers is None:
        pairs = [(label_fields[0], int(model_config.num_class))]
    else:
        pairs = [(_tower_label(t, i, label_fields), int(t.num_class))
                 for i, t in enumerate(towers)]
    out: dict[str, int] = {}
    for name, classes in pairs:
        if classes > 1 and name in label_fields:
            out[name] = min(classes, out.get(name, classes))
    return out


def _domain_label(model_config) -> tuple[str, int] | None:
    """(``domain_input_name``, ``task_domain_num``) of a PEPNet with towers per domain
    (told by the fields, as ``_task_towers``; the model checks them), else None."""
    if model_config is None or model_config.WhichOneof("model") != "pepnet" \
            or not model_config.pepnet.domain_input_name:
        return None
    return model_config.pepnet.domain_input_name, int(model_config.pepnet.task_domain_num)


def _tower_label(tower, position: int, label_fields: list[str]) -> str:
    """A task tower's label column: as hashrec.models.tasks, a tower without label_name
    (DBMTL's and DC2VR's may leave it out) reads the label field of its position."""
    if tower.HasField("label_name") or position >= len(label_fields):
        return tower.label_name
    return label_fields[position]


def _binary_loss(loss_configs) -> str:
    """The binary loss among ``loss_configs`` (binary_cross_entropy where there is none),
    or "" where they train on another."""
    losses = [loss.WhichOneof("loss") for loss in loss_configs] or ["binary_cross_entropy"]
    return next((loss for loss in losses
                 if loss in ("binary_cross_entropy", "binary_focal_loss")), "")


def _check_names(features: list[Feature], label_fields: list[str],
                 weights: Iterable[str] = ()) -> None:
    """Feature names are unique, and neither a feature name nor an input is a label or
    a sample weight column (``weights``)."""
    seen: set[str] = set()
    targets = {name: "label" for name in label_fields}
    targets.update((name, "sample weight") for name in weights)
    for feature in features:
        if feature.name in seen:
            raise ConfigError(f"feature name {feature.name!r} is used twice")
        seen.add(feature.name)
        if feature.name in targets:
            raise ConfigError(f"feature name {feature.name!r} is a {targets[feature.name]} "
                              f"field of data_config; rename the feature")
        leaked = sorted(set(targets).intersection(feature.columns))
        if leaked:
            kind = targets[leaked[0]]
            raise ConfigError(f"feature {feature.name!r} reads {kind} column {leaked[0]!r}; "
                              f"a {kind} cannot be a model input")

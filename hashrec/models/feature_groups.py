"""Assemble a model's feature groups from embedding outputs and dense inputs.

A DEEP group concatenates, in ``feature_names`` order, each feature's pooled
embedding (B, dim) or raw dense values (B, value_dim) into (B, D).

A SEQUENCE group splits its ``feature_names`` into query features (pooled or
dense, e.g. the candidate item's ``adgroup_id``) and sequence features (padded
sequences, e.g. ``click_50_seq__adgroup_id``). The query is the query features
concatenated (B, Dq); the sequence is the sequence features, padded to the
longest L, concatenated along the last axis (B, L, Ds): item i of every
sequence feature forms position i. A row's length (B,) is the largest of its
id sequence features' lengths in that row, clamped to L; a feature with fewer
items there reads as its zero padding at the positions it lacks. Features of
one sequence (the sub-features of a ``sequence_feature``) have one length per
row, which this keeps. Features of different sequences (two top-level sequence
features, or sub-features of two ``sequence_feature`` configs) are paired
position by position just the same, which means something only where their
lengths agree: building such a group logs a warning.

A WIDE group concatenates, like a DEEP group, its features' wide embeddings
(``hashrec.features.wide``: ``<feature>@wide``, (B, wide_embedding_dim) each).

A JAGGED_SEQUENCE group (TorchEasyRec's name for the sequences of its HSTU models, which
it keeps jagged) holds sequence features alone, padded and concatenated as a SEQUENCE
group's; it may hold raw sequences alone (a history's timestamps), whose lengths are
another group's (``sequence_input`` gives None for them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from hashrec.config.sequence_groups import (
    QUERYLESS_ENCODERS,
    encoder_input,
    encoder_kind,
    sequence_group_names,
)
from hashrec.features.wide import wide_name
from hashrec.models.errors import ModelError

DEEP = "DEEP"
SEQUENCE = "SEQUENCE"
WIDE = "WIDE"
JAGGED = "JAGGED_SEQUENCE"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureInfo:
    """What the group assembler needs to know about one feature.

    Attributes:
        name: feature name (KeyedJaggedTensor key or dense input name).
        dim: width of its contribution (embedding dim or value_dim).
        embedded: read from the embedding output (else from the batch's dense inputs).
        is_sequence: a padded (B, L, dim) sequence (else a (B, dim) vector).
        sequence: of a sequence feature, the sequence whose items it holds (its
            ``sequence_feature``'s name, or its own name for a top-level one); else empty.
        source: of a sequence encoder's output, the DEEP feature group whose encoder
            gives it (see ``encoded``); else empty.
        length: of a sequence feature, the positions it is padded to (its
            ``sequence_length``); 0 where unknown.
    """

    name: str
    dim: int
    embedded: bool
    is_sequence: bool
    sequence: str = ""
    source: str = ""
    length: int = 0

    @property
    def encoded(self) -> bool:
        """An encoder's output (``<group>_seq_encoder_<i>``, (B, dim)), computed by the
        sequence encoders of the feature group ``source`` inside the dense network."""
        return bool(self.source)


@dataclass(frozen=True)
class EncoderSpec:
    """One of a DEEP group's ``sequence_encoders``.

    Attributes:
        kind: ``din_encoder``, ``simple_attention``, ``pooling_encoder``,
            ``multi_window_din_encoder`` or ``hstu_encoder``.
        where: the config path of the encoder (for errors).
        input: index of the sequence group it reads in the group's ``sequence_groups``.
        dim: width of its output.
        options: the encoder's config message (attn_mlp, pooling_type, windows_len, the
            HSTU fields).
    """

    kind: str
    where: str
    input: int
    dim: int
    options: object = field(compare=False, repr=False)


@dataclass(frozen=True)
class GroupSpec:
    """One feature group: ``features`` for DEEP and WIDE; ``query`` and ``sequence`` for
    SEQUENCE. A DEEP group with sequence encoders also has ``sequence_groups`` (SEQUENCE
    specs, whose query may be empty) and ``encoders``; its ``features`` end with the
    encoders' outputs (``FeatureInfo.encoded``)."""

    name: str
    group_type: str
    features: tuple[FeatureInfo, ...] = ()
    query: tuple[FeatureInfo, ...] = ()
    sequence: tuple[FeatureInfo, ...] = ()
    sequence_groups: tuple[GroupSpec, ...] = ()
    encoders: tuple[EncoderSpec, ...] = ()

    @property
    def dim(self) -> int:
        """DEEP (or WIDE) width D."""
        return sum(f.dim for f in self.features)

    @property
    def query_dim(self) -> int:
        return sum(f.dim for f in self.query)

    @property
    def sequence_dim(self) -> int:
        return sum(f.dim for f in self.sequence)

    @property
    def sequence_length(self) -> int:
        """The positions L of a SEQUENCE group's (B, L, Ds) sequence: its longest
        feature's; 0 where unknown."""
        return max((f.length for f in self.sequence), default=0)


def feature_infos(feature_set) -> dict[str, FeatureInfo]:
    """Index the features a FeatureSet produces by name."""
    infos: dict[str, FeatureInfo] = {}
    sequences = feature_set.sequence_names()
    for spec in feature_set.embedding_features():
        infos[spec.name] = FeatureInfo(spec.name, int(feature_set.output_dim(spec.name)),
                                       True, bool(spec.is_sequence),
                                       sequences[spec.name] if spec.is_sequence else "",
                                       length=int(spec.max_length) if spec.is_sequence else 0)
    for name, value_dim in feature_set.dense_features().items():
        infos[name] = FeatureInfo(name, int(value_dim), False, False)
    for name, value_dim in feature_set.sequence_dense_features().items():
        infos[name] = FeatureInfo(name, int(value_dim), False, True, sequences[name],
                                  length=int(feature_set.features[name].sequence_length))
    return infos


def build_group_spec(group_config, infos: Mapping[str, FeatureInfo],
                     left_out: Iterable[str] = (), sequence_query: bool = True) -> GroupSpec:
    """Resolve one ``feature_groups`` entry against the known features (``left_out``:
    configured features no group names, listed among the known ones in errors;
    ``sequence_query``: a SEQUENCE group needs query features).

    Raises:
        ModelError: unknown feature, empty group, a sequence in a DEEP group, a
            SEQUENCE group without query or sequence features, a WIDE group feature
            without a wide embedding, or an unsupported type.
    """
    name = group_config.group_name
    group_type = _group_type_name(group_config)
    if not group_config.feature_names:
        raise ModelError(f"feature group {name!r} lists no feature_names")
    if group_type == WIDE:
        return GroupSpec(name, WIDE, features=tuple(
            _wide_feature(name, feature, infos) for feature in group_config.feature_names))
    resolved = [_known(f"feature group {name!r}", feature, infos, left_out)
                for feature in group_config.feature_names]
    if group_type == DEEP:
        sequences = [f.name for f in resolved if f.is_sequence]
        if sequences:
            raise ModelError(
                f"DEEP feature group {name!r} holds sequence features {sequences}; "
                f"put them in a SEQUENCE group, or in a sequence_groups entry of this "
                f"group read by sequence_encoders")
        if group_config.sequence_groups:
            return _encoded_group(group_config, tuple(resolved), infos, left_out)
        return GroupSpec(name, DEEP, features=tuple(resolved))
    if group_type == SEQUENCE:
        return _sequence_group(f"SEQUENCE feature group {name!r}", name, resolved,
                               sequence_query)
    if group_type == JAGGED:
        return _jagged_group(name, resolved)
    raise ModelError(
        f"feature group {name!r}: group_type {group_type} is not supported; allowed: DEEP, "
        f"WIDE, SEQUENCE, JAGGED_SEQUENCE")


def _jagged_group(name: str, resolved: list[FeatureInfo]) -> GroupSpec:
    """A JAGGED_SEQUENCE group: sequence features alone, ids not needed."""
    pooled = [f.name for f in resolved if not f.is_sequence]
    if pooled:
        raise ModelError(f"JAGGED_SEQUENCE feature group {name!r} holds features that are not "
                         f"sequences {pooled}; it holds sequence features alone: put them "
                         f"in a DEEP group")
    _warn_mixed_sequences(name, tuple(resolved))
    return GroupSpec(name, JAGGED, sequence=tuple(resolved))


def _sequence_group(label: str, name: str, resolved: list[FeatureInfo],
                    needs_query: bool = True) -> GroupSpec:
    """The SEQUENCE spec of ``resolved`` (query features, sequence features); ``label``
    names the group in errors."""
    query = tuple(f for f in resolved if not f.is_sequence)
    sequence = tuple(f for f in resolved if f.is_sequence)
    if (needs_query and not query) or not sequence:
        raise ModelError(
            f"{label} needs query (non-sequence) and sequence features; got "
            f"query={[f.name for f in query]} sequence={[f.name for f in sequence]}")
    if not any(f.embedded for f in sequence):
        raise ModelError(f"{label} needs at least one id sequence feature to give the "
                         f"sequence lengths")
    _warn_mixed_sequences(name, sequence)
    return GroupSpec(name, SEQUENCE, query=query, sequence=sequence)


def _encoded_group(group_config, features: tuple[FeatureInfo, ...],
                   infos: Mapping[str, FeatureInfo], left_out: Iterable[str]) -> GroupSpec:
    """A DEEP group with sequence groups and encoders (``hashrec.config.sequence_groups``;
    the config's validation has checked their structure)."""
    name = group_config.group_name
    names = sequence_group_names(group_config)
    readers = {n: [encoder_kind(e) for e in group_config.sequence_encoders
                   if encoder_input(group_config, e) == n] for n in names}
    sequence_groups = []
    for i, (seq_name, seq_config) in enumerate(zip(names, group_config.sequence_groups)):
        label = f"feature group {name!r} sequence_groups[{i}] ({seq_name!r})"
        resolved = [_known(label, f, infos, left_out) for f in seq_config.feature_names]
        needs_query = any(kind not in QUERYLESS_ENCODERS for kind in readers[seq_name])
        sequence_groups.append(_sequence_group(label, seq_name, resolved, needs_query))
    encoders = []
    for i, encoder in enumerate(group_config.sequence_encoders):
        kind = encoder_kind(encoder)
        index = names.index(encoder_input(group_config, encoder))
        options = getattr(encoder, kind)
        width = sequence_groups[index].sequence_dim
        windows = len(options.windows_len) if kind == "multi_window_din_encoder" else 0
        encoders.append(EncoderSpec(
            kind, f"feature group {name!r} sequence_encoders[{i}].{kind}", index,
            width * (windows + 1), options))
    outputs = tuple(FeatureInfo(f"{name}_seq_encoder_{i}", e.dim, False, False, source=name)
                    for i, e in enumerate(encoders))
    return GroupSpec(name, DEEP, features=features + outputs,
                     sequence_groups=tuple(sequence_groups), encoders=tuple(encoders))


def _known(label: str, feature: str, infos: Mapping[str, FeatureInfo],
           left_out: Iterable[str]) -> FeatureInfo:
    if feature not in infos:
        raise ModelError(f"{label}: feature {feature!r} is not defined in feature_configs "
                         f"(known: {', '.join(sorted({*infos, *left_out}))})")
    return infos[feature]


def _wide_feature(group: str, feature: str, infos: Mapping[str, FeatureInfo]) -> FeatureInfo:
    """The wide embedding of a WIDE group's ``feature``."""
    if wide_name(feature) in infos:
        return infos[wide_name(feature)]
    if feature not in infos:
        known = sorted(n for n in infos if not n.endswith(wide_name("")))
        raise ModelError(f"WIDE feature group {group!r}: feature {feature!r} is not defined in "
                         f"feature_configs (known: {', '.join(known)})")
    kind = "a sequence feature" if infos[feature].is_sequence else \
        "a raw feature without boundaries (no embedding table)"
    raise ModelError(f"WIDE feature group {group!r}: feature {feature!r} is {kind}; a WIDE "
                     f"group sums the embeddings of pooled id features and of raw features "
                     f"with boundaries: put it in a DEEP or SEQUENCE group")


def _warn_mixed_sequences(group: str, sequence: tuple[FeatureInfo, ...]) -> None:
    """Sequence features of different sequences are paired position by position and a row
    attends over as many positions as the longest has items: say so, once, at build."""
    by_sequence: dict[str, list[str]] = {}
    for info in sequence:
        by_sequence.setdefault(info.sequence, []).append(info.name)
    if len(by_sequence) > 1:
        logger.warning(
            "SEQUENCE feature group %r mixes features of %d sequences (%s): their items are "
            "paired position by position and a row attends over as many positions as its "
            "longest sequence has items, so their lengths should agree in every row; if they "
            "do not, give each sequence its own SEQUENCE group", group, len(by_sequence),
            "; ".join(f"{seq}: {', '.join(names)}" for seq, names in by_sequence.items()))


def _group_type_name(group_config) -> str:
    value = group_config.group_type
    if isinstance(value, str):
        return value
    return group_config.DESCRIPTOR.fields_by_name["group_type"].enum_type.values_by_number[
        value].name


def _vector(info: FeatureInfo, embedded, batch) -> torch.Tensor:
    if info.embedded:
        return embedded.pooled[info.name]
    return batch.dense[info.name]


def deep_input(group: GroupSpec, embedded, batch) -> torch.Tensor:
    """(B, group.dim) concatenation of a DEEP group's features."""
    return torch.cat([_vector(f, embedded, batch) for f in group.features], dim=-1)


def query_input(group: GroupSpec, embedded, batch) -> torch.Tensor | None:
    """A SEQUENCE group's query (B, Dq): its query features concatenated; None for a group
    without query features."""
    return torch.cat([_vector(f, embedded, batch) for f in group.query], dim=-1) \
        if group.query else None


def sequence_input(group: GroupSpec, embedded,
                   batch) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """A SEQUENCE group's (query (B, Dq), sequence (B, L, Ds), lengths (B,)); the query is
    None for a sequence group without query features (one that pooling alone reads).

    ``lengths`` is, per row, the largest of the id sequence features' lengths (an
    elementwise maximum on the device: no host read), clamped to L; None for a
    JAGGED_SEQUENCE group of raw sequences alone.
    """
    query = query_input(group, embedded, batch)
    parts, lengths = [], None
    for info in group.sequence:
        if info.embedded:
            values, feature_lengths = embedded.sequences[info.name]
            lengths = feature_lengths if lengths is None \
                else torch.maximum(lengths, feature_lengths)
        else:
            values = batch.sequence_dense[info.name]
        parts.append(values)
    max_length = max(p.shape[1] for p in parts)
    parts = [torch.nn.functional.pad(p, (0, 0, 0, max_length - p.shape[1])) for p in parts]
    sequence = torch.cat(parts, dim=-1)
    return query, sequence, None if lengths is None else lengths.clamp(max=max_length)


def raw_sequence_groups(groups: Mapping[str, GroupSpec],
                        needs: Mapping[str, tuple[bool, str]], where: str,
                        reader: str) -> dict[str, GroupSpec]:
    """The groups of one raw value a sequence position (an HSTU model's actions, watch times
    and timestamps) that the model reads, by name. ``needs`` maps a group's name to (whether
    the config reads it, the config field that does); ``where`` names the model in errors,
    ``reader`` the part of its config that reads the groups.

    Raises:
        ModelError: a group read but not defined, or not one raw sequence sub-feature.
    """
    read = {}
    for name, (needed, why) in needs.items():
        group = groups.get(name)
        if group is None:
            if needed:
                raise ModelError(f"{where}: {why} reads the feature group {name!r}, which is "
                                 f"not defined; add it (a JAGGED_SEQUENCE group of one raw "
                                 f"sequence sub-feature)")
            continue
        if not needed:
            logger.warning("%s: feature group %r is not read (nothing of the %s reads it: %s)",
                           where, name, reader, why)
            continue
        features = group.sequence if group.group_type in (SEQUENCE, JAGGED) else ()
        if group.query or len(features) != 1 or features[0].embedded or features[0].dim != 1:
            raise ModelError(f"{where}: feature group {name!r} must hold one raw sequence "
                             f"feature of one value a position (a raw_feature sub-feature of "
                             f"a sequence_feature), as JAGGED_SEQUENCE")
        read[name] = group
    return read


def id_sequence_group(group: GroupSpec, where: str) -> GroupSpec:
    """``group`` checked as an HSTU model's history or candidate group: SEQUENCE or
    JAGGED_SEQUENCE, of sequence features alone, one of them ids (which give its lengths);
    ``where`` names the model (or its field) in errors.

    Raises:
        ModelError: a group of another kind.
    """
    name = group.name
    if group.group_type not in (SEQUENCE, JAGGED):
        raise ModelError(f"{where}: feature group {name!r} is {group.group_type}, expected "
                         f"JAGGED_SEQUENCE (or SEQUENCE)")
    if group.query:
        raise ModelError(f"{where}: feature group {name!r} holds features that are not "
                         f"sequences {[f.name for f in group.query]}; it holds sequence "
                         f"features alone")
    if not any(f.embedded for f in group.sequence):
        raise ModelError(f"{where}: feature group {name!r} holds no id sequence feature, "
                         f"which gives the rows' lengths")
    return group

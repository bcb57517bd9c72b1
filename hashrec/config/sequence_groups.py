"""A DEEP feature group's ``sequence_groups`` and ``sequence_encoders``, as TorchEasyRec
reads them.

A DEEP group may list sequence groups, each a set of query features (pooled, such as the
candidate's ``adgroup_id``) and sequence features (``click_50_seq__adgroup_id``), and
encoders that reduce a sequence group to one vector a row (DIN target attention, simple
attention, sum or mean pooling, multi-window DIN, HSTU blocks). The encoders' outputs join
the group's output after its own features, in encoder order, so every model reading the
group reads them too (``hashrec.models.group_encoders`` builds them).

As in TorchEasyRec: a lone sequence group without ``group_name`` takes the feature group's
name, an encoder without ``input`` reads the lone sequence group, several sequence
groups need names and their encoders an ``input``, and every sequence group needs an
encoder. Nothing here mutates the config: the defaults are resolved on reading.
"""

from __future__ import annotations

SUPPORTED_ENCODERS = ("din_encoder", "simple_attention", "pooling_encoder",
                      "multi_window_din_encoder", "hstu_encoder")
# The encoders that read no query: a sequence group that only they read needs none.
QUERYLESS_ENCODERS = ("pooling_encoder", "hstu_encoder")
POOLING_TYPES = ("sum", "mean")
# TorchEasyRec's HSTU blocks compute rel_bias and hstu_rel_bias alike (SiLU attention
# without a bias: the encoder passes no timestamps); softmax_rel_bias needs timestamps.
HSTU_NORMALIZATIONS = ("rel_bias", "hstu_rel_bias")
HSTU_LINEAR_ACTIVATIONS = ("silu", "none")
_DEEP = 0  # FeatureGroupType.DEEP


def sequence_group_names(group) -> list[str]:
    """The names of ``group``'s sequence groups, in order (a lone one without
    ``group_name`` takes the feature group's name)."""
    groups = group.sequence_groups
    if len(groups) == 1 and not groups[0].group_name:
        return [group.group_name]
    return [g.group_name for g in groups]


def encoder_kind(encoder) -> str | None:
    """The encoder entry's kind (``din_encoder``, ...), None for an empty entry."""
    return encoder.WhichOneof("seq_module")


def encoder_input(group, encoder) -> str:
    """The sequence group an encoder reads (its ``input``, or the lone sequence group);
    empty where it names none and the group has several."""
    options = getattr(encoder, encoder_kind(encoder))
    if options.input:
        return options.input
    names = sequence_group_names(group)
    return names[0] if len(names) == 1 else ""


def group_feature_names(group) -> list[str]:
    """Every feature ``group`` reads: its ``feature_names``, then its sequence groups'
    features, each name once."""
    names = list(group.feature_names)
    for sequence_group in group.sequence_groups:
        names += sequence_group.feature_names
    return list(dict.fromkeys(names))


def sequence_encoder_problems(model_config) -> list[str]:
    """One message per misuse of ``sequence_groups`` / ``sequence_encoders``, naming the
    field."""
    problems = []
    for i, group in enumerate(model_config.feature_groups):
        if not group.sequence_groups and not group.sequence_encoders:
            continue
        where = f"model_config.feature_groups[{i}] ({group.group_name!r})"
        if group.group_type != _DEEP:
            problems.append(f"{where}: sequence_groups and sequence_encoders belong to a DEEP "
                            f"group (as in TorchEasyRec); set group_type: DEEP or move them")
            continue
        problems += _group_problems(where, group)
    return problems


def _group_problems(where: str, group) -> list[str]:
    if not group.sequence_groups:
        return [f"{where}.sequence_encoders: the group has no sequence_groups for them to "
                f"read; add a sequence_groups entry listing query and sequence features"]
    if not group.sequence_encoders:
        return [f"{where}.sequence_groups: no sequence_encoders reads them; add one (e.g. "
                f"sequence_encoders {{ din_encoder {{ attn_mlp {{ hidden_units: [32] }} }} }})"]
    problems = []
    names = sequence_group_names(group)
    for j, sequence_group in enumerate(group.sequence_groups):
        if len(names) > 1 and not sequence_group.group_name:
            problems.append(f"{where}.sequence_groups[{j}] has no group_name; with several "
                            f"sequence groups each needs one")
        if not sequence_group.feature_names:
            problems.append(f"{where}.sequence_groups[{j}] lists no feature_names")
    repeated = sorted({n for n in names if n and names.count(n) > 1})
    if repeated:
        problems.append(f"{where}.sequence_groups: group_name {', '.join(repeated)} is "
                        f"given twice; name each sequence group once")
    read = set()
    for j, encoder in enumerate(group.sequence_encoders):
        problems += _encoder_problems(f"{where}.sequence_encoders[{j}]", group, encoder, names)
        if encoder_kind(encoder) is not None:
            read.add(encoder_input(group, encoder))
    unread = [n for n in names if n and n not in read]
    if unread:
        problems.append(f"{where}.sequence_groups {', '.join(map(repr, unread))}: no "
                        f"sequence encoder reads it; add an encoder with that input or "
                        f"remove the sequence group")
    return problems


def _encoder_problems(where: str, group, encoder, names: list[str]) -> list[str]:
    kind = encoder_kind(encoder)
    if kind is None:
        return [f"{where} sets no encoder; set one of {', '.join(SUPPORTED_ENCODERS)}"]
    if kind not in SUPPORTED_ENCODERS:
        return [f"{where}.{kind} is not supported; supported: {', '.join(SUPPORTED_ENCODERS)}"
                f" (for target attention over a sequence use din_encoder)"]
    options = getattr(encoder, kind)
    source = encoder_input(group, encoder)
    problems = []
    if not source:
        problems.append(f"{where}.{kind}.input is not set; with several sequence groups "
                        f"name the one it reads ({', '.join(names)})")
    elif source not in names:
        problems.append(f"{where}.{kind}.input {source!r} is not a sequence group of the "
                        f"feature group (sequence groups: {', '.join(names)})")
    if kind == "pooling_encoder" and options.pooling_type not in POOLING_TYPES:
        problems.append(f"{where}.pooling_encoder.pooling_type {options.pooling_type!r}; "
                        f"allowed: {', '.join(POOLING_TYPES)}")
    if kind == "multi_window_din_encoder" and (
            not options.windows_len or min(options.windows_len) < 1):
        problems.append(f"{where}.multi_window_din_encoder.windows_len "
                        f"{list(options.windows_len)}; give one or more window lengths, "
                        f"each 1 or more positions")
    if kind == "hstu_encoder":
        problems += hstu_problems(f"{where}.hstu_encoder", options)
    return problems


def hstu_problems(where: str, options) -> list[str]:
    """One message per ``hstu_encoder`` field HashRec cannot honour (``where``: the
    encoder's config path)."""
    problems = []
    for name, what in (("max_seq_length", "it sizes the position embeddings"),
                       ("attn_dim", "the width of a head's queries and keys"),
                       ("linear_dim", "the width of a head's values and gates")):
        if getattr(options, name) < 1:
            shown = getattr(options, name) if options.HasField(name) else "not set"
            problems.append(f"{where}.{name} is {shown}; set it to 1 or more ({what})")
    problems += [f"{where}.{name} is {getattr(options, name)}; it must be {least} or more"
                 for name, least in (("num_heads", 1), ("num_blocks", 1),
                                     ("max_output_len", 0))
                 if getattr(options, name) < least]
    problems += [f"{where}.{name} is {getattr(options, name):g}; it must be in [0, 1)"
                 for name in ("pos_dropout_rate", "linear_dropout_rate")
                 if not 0 <= getattr(options, name) < 1]
    if options.normalization not in HSTU_NORMALIZATIONS:
        problems.append(f"{where}.normalization {options.normalization!r}; allowed: "
                        f"{', '.join(HSTU_NORMALIZATIONS)} (softmax_rel_bias needs "
                        f"timestamps, which the encoder is not given)")
    if options.linear_config != "uvqk":
        problems.append(f"{where}.linear_config {options.linear_config!r}; allowed: uvqk")
    if options.linear_activation not in HSTU_LINEAR_ACTIVATIONS:
        problems.append(f"{where}.linear_activation {options.linear_activation!r}; "
                        f"allowed: {', '.join(HSTU_LINEAR_ACTIVATIONS)}")
    return problems

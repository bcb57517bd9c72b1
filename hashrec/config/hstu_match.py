"""What ``model_config.hstu_match`` asks for that HashRec refuses before any data is read.

TorchEasyRec's HSTU match model reads its user tower's HSTU settings (its module.proto's
``HSTU``, shared with its ranking model dlrm_hstu); HashRec builds the part of them that
a match user tower uses: the UIH preprocessor, the positional encoder, the STU layers and
the output postprocessor. Each message here names the field and what it may hold; the
checks of the HSTU modules serve dlrm_hstu's (``hashrec.config.dlrm_hstu``) too.
(Semi-local attention, attention truncation and MoT channel names are refused by
``hashrec.config.unused``.)
"""

from __future__ import annotations

import math

from hashrec.config.floats import proto_float

WHERE = "model_config.hstu_match"
TIME_BUCKET_FNS = ("sqrt", "log")


def hstu_match_problems(model_config) -> list[str]:
    """One message per refused setting of ``model_config.hstu_match``."""
    config = model_config.hstu_match
    problems = []
    if config.in_batch_negative:
        problems.append(f"{WHERE}.in_batch_negative is not supported (as in TorchEasyRec: "
                        f"a row's several positives make in-batch negatives ill-defined); "
                        f"remove it and set data_config.negative_sampler")
    tower = config.user_tower
    where = f"{WHERE}.user_tower"
    if tower.max_seq_len < 1:
        problems.append(f"{where}.max_seq_len is {tower.max_seq_len}; set it to the longest "
                        f"history, 1 or more (the attention divides by it)")
    hstu = tower.hstu
    problems += stu_problems(hstu.stu, f"{where}.hstu.stu")
    if hstu.attn_num_layers < 1:
        problems.append(f"{where}.hstu.attn_num_layers is 0; it must be 1 or more")
    problems += ratio_problems(hstu.input_dropout_ratio, f"{where}.hstu.input_dropout_ratio")
    problems += positional_problems(hstu.positional_encoder,
                                     f"{where}.hstu.positional_encoder")
    problems += _preprocessor_problems(hstu.input_preprocessor,
                                       f"{where}.hstu.input_preprocessor")
    problems += postprocessor_problems(hstu.output_postprocessor,
                                        f"{where}.hstu.output_postprocessor")
    return problems


def stu_problems(stu, where: str) -> list[str]:
    problems = [f"{where}.{name} is {getattr(stu, name)}; it must be 1 or more"
                for name in ("embedding_dim", "num_heads", "hidden_dim", "attention_dim")
                if getattr(stu, name) < 1]
    problems += ratio_problems(stu.output_dropout_ratio, f"{where}.output_dropout_ratio")
    if stu.HasField("attn_alpha"):
        alpha = proto_float(stu.attn_alpha)
        if not (math.isfinite(alpha) and alpha > 0):
            problems.append(f"{where}.attn_alpha is {alpha}; allowed: a finite number > 0 "
                            f"(unset: 1 / sqrt(attention_dim))")
    if stu.scaling_seqlen == 0:
        problems.append(f"{where}.scaling_seqlen is 0; the attention divides by it: leave it "
                        f"unset (the user tower's max_seq_len) or set 1 or more")
    return problems


def ratio_problems(value: float, where: str) -> list[str]:
    """A dropout ratio outside [0, 1), named by ``where``."""
    value = proto_float(value)
    if 0 <= value < 1:
        return []
    return [f"{where} is {value}; it must be in [0, 1)"]


def positional_problems(encoder, where: str) -> list[str]:
    problems = []
    if encoder.num_position_buckets < 1:
        problems.append(f"{where}.num_position_buckets is {encoder.num_position_buckets}; "
                        f"it must be 1 or more")
    if encoder.time_bucket_fn not in TIME_BUCKET_FNS:
        problems.append(f"{where}.time_bucket_fn {encoder.time_bucket_fn!r}; allowed: "
                        f"{', '.join(TIME_BUCKET_FNS)}")
    increments = proto_float(encoder.time_bucket_increments)
    if not (math.isfinite(increments) and increments > 0):
        problems.append(f"{where}.time_bucket_increments is {increments}; allowed: a finite "
                        f"number > 0 (default 60)")
    if encoder.use_time_encoding and encoder.num_time_buckets < 1:
        problems.append(f"{where}.num_time_buckets is {encoder.num_time_buckets}; "
                        f"use_time_encoding needs 1 or more")
    return problems


def _preprocessor_problems(preprocessor, where: str) -> list[str]:
    kind = preprocessor.WhichOneof("input_preprocessor")
    if kind != "uih_preprocessor":
        return [f"{where}.{kind} is not supported by hstu_match (TorchEasyRec's ranking "
                f"model dlrm_hstu reads it); use uih_preprocessor {{ }} (with action_encoder "
                f"and action_mlp for the actions)"]
    uih = preprocessor.uih_preprocessor
    where = f"{where}.uih_preprocessor"
    return actions_problems(uih, where)


def actions_problems(options, where: str) -> list[str]:
    """The problems of a preprocessor's ``action_encoder`` and ``action_mlp`` (both or
    neither)."""
    if options.HasField("action_encoder") != options.HasField("action_mlp"):
        has, lacks = ("action_encoder", "action_mlp") if options.HasField("action_encoder") \
            else ("action_mlp", "action_encoder")
        return [f"{where} sets {has} without {lacks}; the actions are embedded by "
                f"action_encoder and projected by action_mlp: set both, or neither"]
    if not options.HasField("action_encoder"):
        return []
    problems = []
    if options.action_encoder.WhichOneof("action_encoder") is None:
        problems.append(f"{where}.action_encoder sets no encoder; use "
                        f"simple_action_encoder {{ ... }}")
    else:
        problems += action_problems(options.action_encoder.simple_action_encoder,
                                    f"{where}.action_encoder.simple_action_encoder")
    return problems + contextualized_mlp_problems(options.action_mlp, f"{where}.action_mlp")


def contextualized_mlp_problems(config, where: str) -> list[str]:
    """A contextualized MLP's (``simple_mlp`` or ``parameterized_mlp``) problems."""
    kind = config.WhichOneof("contextualized_mlp")
    if kind is None:
        return [f"{where} sets no MLP; use simple_mlp {{ hidden_dim }} or "
                f"parameterized_mlp {{ hidden_dim }}"]
    mlp = getattr(config, kind)
    problems = []
    if mlp.hidden_dim < 1:
        problems.append(f"{where}.{kind}.hidden_dim is {mlp.hidden_dim}; it must be 1 or more")
    if kind == "parameterized_mlp":
        problems += ratio_problems(mlp.contextual_dropout_ratio,
                                   f"{where}.{kind}.contextual_dropout_ratio")
    return problems


def action_problems(encoder, where: str) -> list[str]:
    problems = []
    if encoder.action_embedding_dim < 1:
        problems.append(f"{where}.action_embedding_dim is {encoder.action_embedding_dim}; "
                        f"it must be 1 or more")
    if not encoder.action_weights:
        problems.append(f"{where}.action_weights is empty; list each action's bit (1, 2, "
                        f"4, ...)")
    if len(encoder.watchtime_to_action_thresholds) != len(encoder.watchtime_to_action_weights):
        problems.append(f"{where}: watchtime_to_action_thresholds lists "
                        f"{len(encoder.watchtime_to_action_thresholds)} thresholds and "
                        f"watchtime_to_action_weights {len(encoder.watchtime_to_action_weights)}"
                        f" bits; give each threshold its bit")
    std = proto_float(encoder.embedding_init_std)
    if not (math.isfinite(std) and std >= 0):
        problems.append(f"{where}.embedding_init_std is {std}; allowed: a finite number >= 0")
    return problems


def postprocessor_problems(postprocessor, where: str) -> list[str]:
    kind = postprocessor.WhichOneof("output_postprocessor")
    if kind is None:
        return [f"{where} sets no postprocessor; use l2norm_postprocessor {{}}, "
                f"layernorm_postprocessor {{}} or timestamp_layernorm_postprocessor {{ ... }}"]
    if kind != "timestamp_layernorm_postprocessor":
        return []
    options = postprocessor.timestamp_layernorm_postprocessor
    units, counts = options.time_duration_period_units, options.time_duration_units_per_period
    where = f"{where}.{kind}"
    if len(units) != len(counts) or not units:
        return [f"{where}: time_duration_period_units lists {len(units)} periods and "
                f"time_duration_units_per_period {len(counts)}; give each period (1 or more) "
                f"its count"]
    if min(units) < 1 or min(counts) < 1:
        return [f"{where}: periods and their counts must be 1 or more"]
    return []

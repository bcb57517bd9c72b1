"""The HSTU models' shared parts built from their config (``hstu_match``'s user tower and
``dlrm_hstu``'s network): the contextual tokens' count check, the action encoder, the
contextualized MLPs and the positional encoder, STU layers and output postprocessor."""

from __future__ import annotations

from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.modules.hstu_inputs import ActionEncoder, contextualized_mlp
from hashrec.modules.stu import OutputPostprocessor, PositionalEncoder, STULayer


def check_contextual_count(stu, count: int, where: str, group: str) -> None:
    """``stu.contextual_seq_len``, where set, must be the ``count`` tokens of ``group``."""
    if stu.contextual_seq_len >= 0 and stu.contextual_seq_len != count:
        raise ModelError(f"{where}.stu.contextual_seq_len is {stu.contextual_seq_len}, but the "
                         f"feature group {group!r} gives {count} contextual tokens; leave it "
                         f"unset")


def action_encoder(config) -> ActionEncoder:
    """The ``simple_action_encoder`` of an ``action_encoder`` config."""
    options = config.simple_action_encoder
    return ActionEncoder(options.action_embedding_dim, list(options.action_weights),
                         list(options.watchtime_to_action_thresholds),
                         list(options.watchtime_to_action_weights),
                         proto_float(options.embedding_init_std))


def contextualized(config, kind: str, input_dim: int, output_dim: int,
                   contextual_dim: int) -> nn.Module:
    """The contextualized MLP ``kind`` (``simple_mlp`` or ``parameterized_mlp``) of
    ``config``."""
    options = getattr(config, kind)
    dropout = proto_float(options.contextual_dropout_ratio) \
        if kind == "parameterized_mlp" else 0.0
    return contextualized_mlp(kind, input_dim, output_dim, options.hidden_dim, contextual_dim,
                              dropout)


def stu_stack(hstu, dim: int, count: int, scaling: int
              ) -> tuple[PositionalEncoder, nn.ModuleList, OutputPostprocessor]:
    """The positional encoder (``count`` contextual tokens first), the STU layers
    (attention divided by ``scaling``) and the output postprocessor of ``hstu``, all of
    width ``dim``.

    Raises:
        ValueError: an option the modules refuse.
    """
    encoder = hstu.positional_encoder
    positional = PositionalEncoder(dim, encoder.num_position_buckets, encoder.num_time_buckets,
                                   encoder.use_time_encoding, count, encoder.time_bucket_fn,
                                   proto_float(encoder.time_bucket_increments))
    stu = hstu.stu
    layers = nn.ModuleList([
        STULayer(dim, stu.num_heads, stu.hidden_dim, stu.attention_dim,
                 proto_float(stu.output_dropout_ratio),
                 proto_float(stu.attn_alpha) if stu.HasField("attn_alpha") else 0.0,
                 stu.use_group_norm, int(scaling))
        for _ in range(hstu.attn_num_layers)])
    post = hstu.output_postprocessor
    periods = post.timestamp_layernorm_postprocessor
    postprocessor = OutputPostprocessor(post.WhichOneof("output_postprocessor") or "", dim,
                                        list(periods.time_duration_period_units),
                                        list(periods.time_duration_units_per_period))
    return positional, layers, postprocessor

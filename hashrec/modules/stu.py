"""STU (sequential transduction unit) layers over padded sequences: TorchEasyRec's
``STULayer`` (its HSTU models' layer, from generative-recommenders), its positional
encoder and its output postprocessors, on (B, L, D) tensors of fixed shapes.

TorchEasyRec runs them over jagged sequences; here a row holds its C contextual tokens,
then its history, then padding, and ``lengths`` (B,) counts the first two. Every
position at or past a row's length is zero after each layer, and no position reads one.

One ``STULayer`` with H heads (x (B, L, D) -> (B, L, D))::

    u, v, q, k = split(LayerNorm(x) @ W + b)                 # H*Dh, H*Dh, H*Da, H*Da wide
    u = silu(u)
    a[h, n, m] = silu(alpha <q[n, h], k[m, h]>) / scaling     # where n may read m
    y = x + dropout([u, a v, u * norm(a v)]) @ W_o           # norm: LayerNorm, or GroupNorm
                                                              # of a group a head

with alpha = ``attn_alpha`` (1 / sqrt(Da) unset) and ``scaling`` a fixed divisor (the
user tower's ``max_seq_len``), so that padding a row further changes nothing. Which
positions n reads (``stu_mask``): itself and every position before it; with
``max_attn_len`` M, those at most M history positions back; the C contextual tokens
count as one position before the history (they read every position of the row, history
included, and every history position reads them, within M). With ``num_targets`` T (B,)
(dlrm_hstu's candidates, the last T positions of a row), the targets all count as the
position after the history: each reads the history and itself, never another target,
and no history position reads a target (TorchEasyRec's ``num_targets``).
"""

import math

import torch
from torch import nn
from torch.nn import functional

from hashrec.modules.din import sequence_mask
from hashrec.modules.dropout import dropout
from hashrec.modules.hstu_attention import hstu_attention

POSTPROCESSORS = ("l2norm_postprocessor", "layernorm_postprocessor",
                  "timestamp_layernorm_postprocessor")
TIME_BUCKET_FNS = ("sqrt", "log")


def stu_mask(lengths: torch.Tensor, length: int, contextual: int = 0,
             max_attn_len: int = 0,
             num_targets: torch.Tensor | None = None) -> torch.Tensor:
    """Which positions each position reads (see the module docstring): lengths (B,)
    (targets included), num_targets (B,) or None -> (B, L, L) bool, [b, n, m] True where
    position n of row b reads position m (both within the row's length)."""
    steps = torch.arange(length, device=lengths.device)
    ids = (steps - contextual + 1).clamp(min=0) if contextual > 0 else steps
    ids = ids.unsqueeze(0)
    if num_targets is not None:
        # every target takes the id after the history's last: they read the history and
        # themselves (the diagonal) alone
        top = lengths - num_targets - (contextual - 1 if contextual > 0 else 0)
        ids = torch.minimum(ids, top.unsqueeze(1).to(ids.dtype))
    distance = ids.unsqueeze(2) - ids.unsqueeze(1)
    eye = torch.eye(length, dtype=torch.bool, device=lengths.device).unsqueeze(0)
    allowed = (distance > 0) | eye
    if max_attn_len > 0:
        allowed = allowed & (distance <= max_attn_len)
    if contextual > 0:
        allowed = allowed | (ids == 0).unsqueeze(2)
    valid = sequence_mask(lengths, length)
    return allowed & valid.unsqueeze(2) & valid.unsqueeze(1)


class STULayer(nn.Module):
    """One STU layer (see the module docstring).

    Args:
        embedding_dim: D.
        num_heads: H.
        hidden_dim: Dh, a head's u and v width.
        attention_dim: Da, a head's q and k width.
        output_dropout_ratio: dropout on [u, a v, u * norm(a v)] in training.
        attn_alpha: alpha; 0 for 1 / sqrt(Da).
        use_group_norm: norm a GroupNorm of a group a head (else a LayerNorm).
        scaling_seqlen: the attention's divisor (1 or more).

    Shapes: x (B, L, D), allowed (B, L, L) bool (``stu_mask``) -> (B, L, D).
    """

    use_group_norm: bool

    def __init__(self, embedding_dim: int, num_heads: int, hidden_dim: int,
                 attention_dim: int, output_dropout_ratio: float = 0.3,
                 attn_alpha: float = 0.0, use_group_norm: bool = False,
                 scaling_seqlen: int = 1) -> None:
        super().__init__()
        for name, value in (("embedding_dim", embedding_dim), ("num_heads", num_heads),
                            ("hidden_dim", hidden_dim), ("attention_dim", attention_dim),
                            ("scaling_seqlen", scaling_seqlen)):
            if value < 1:
                raise ValueError(f"{name}={value}; it must be 1 or more")
        if not 0.0 <= output_dropout_ratio < 1.0:
            raise ValueError(f"output_dropout_ratio={output_dropout_ratio}; it must be in "
                             f"[0, 1)")
        self.embedding_dim, self.num_heads = embedding_dim, num_heads
        self.hidden_dim, self.attention_dim = hidden_dim, attention_dim
        self.dropout_ratio = output_dropout_ratio
        self.alpha = attn_alpha if attn_alpha > 0 else 1.0 / math.sqrt(attention_dim)
        self.use_group_norm = use_group_norm
        self.scaling = float(scaling_seqlen)
        width = (2 * hidden_dim + 2 * attention_dim) * num_heads
        self.uvqk_weight = nn.Parameter(torch.empty(embedding_dim, width))
        nn.init.xavier_uniform_(self.uvqk_weight)
        self.uvqk_bias = nn.Parameter(torch.zeros(width))
        self.input_norm_weight = nn.Parameter(torch.ones(embedding_dim))
        self.input_norm_bias = nn.Parameter(torch.zeros(embedding_dim))
        self.output_weight = nn.Parameter(torch.empty(3 * hidden_dim * num_heads,
                                                      embedding_dim))
        nn.init.xavier_uniform_(self.output_weight)
        norm_width = num_heads if use_group_norm else hidden_dim * num_heads
        self.output_norm_weight = nn.Parameter(torch.ones(norm_width))
        self.output_norm_bias = nn.Parameter(torch.zeros(norm_width))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, length = x.shape[0], x.shape[1]
        heads, hidden, attention = self.num_heads, self.hidden_dim, self.attention_dim
        normed = functional.layer_norm(x, [self.embedding_dim], self.input_norm_weight,
                                       self.input_norm_bias, 1e-6)
        uvqk = torch.matmul(normed, self.uvqk_weight) + self.uvqk_bias
        u, v, q, k = torch.split(uvqk, [heads * hidden, heads * hidden, heads * attention,
                                        heads * attention], dim=-1)
        u = functional.silu(u)
        attended = hstu_attention(q.reshape(batch, length, heads, attention),
                                  k.reshape(batch, length, heads, attention),
                                  v.reshape(batch, length, heads, hidden), allowed,
                                  self.alpha, self.scaling)
        attended = attended.reshape(batch, length, heads * hidden)
        if self.use_group_norm:
            # A GroupNorm of a group a head, as a LayerNorm of each head's values and the
            # head's scale and shift: the same values, 3.5x faster forward and backward on
            # an H100 at dlrm_hstu's benchmark shapes (benchmarks/bench_stu_ops.py).
            normed_attended = functional.layer_norm(
                attended.reshape(batch, length, heads, hidden), [hidden], None, None, 1e-6)
            normed_attended = (normed_attended * self.output_norm_weight.unsqueeze(-1)
                               + self.output_norm_bias.unsqueeze(-1)
                               ).reshape(batch, length, heads * hidden)
        else:
            normed_attended = functional.layer_norm(
                attended, [heads * hidden], self.output_norm_weight, self.output_norm_bias,
                1e-6)
        y = torch.cat([u, attended, u * normed_attended], dim=-1)
        y = dropout(y, self.dropout_ratio, self.training)
        return x + torch.matmul(y, self.output_weight)


class PositionalEncoder(nn.Module):
    """TorchEasyRec's ``HSTUPositionalEncoder``: x * sqrt(D) plus an embedding of each
    position and, with ``use_time_encoding``, of its time before the row's last position.

    Positions: without time encoding, position i reads row min(i, P - 1) of the P
    ``num_position_buckets``; with it, a history position i reads min(length - i + C,
    P - 1) (counting back from the row's end) and contextual token i row i. With
    ``num_targets`` T, ``length`` is the history's end (the row's length less T): the T
    targets read the row of the position after the history. Times: the
    gap g = max(last timestamp - timestamp, 1e-6) / ``time_bucket_increments`` reads
    row min(int(max(f(g), 0)), T) of the T + 1, f sqrt or log (``time_bucket_fn``).

    Shapes: x (B, L, D), lengths (B,) (contextual tokens and targets included),
    timestamps (B, L) (0 for the contextual tokens; read only with time encoding),
    num_targets (B,) or None -> (B, L, D).
    """

    use_time_encoding: bool
    log_buckets: bool

    def __init__(self, embedding_dim: int, num_position_buckets: int,
                 num_time_buckets: int = 0, use_time_encoding: bool = False,
                 contextual_seq_len: int = 0, time_bucket_fn: str = "sqrt",
                 time_bucket_increments: float = 60.0) -> None:
        super().__init__()
        if num_position_buckets < 1:
            raise ValueError(f"num_position_buckets={num_position_buckets}; it must be 1 or "
                             f"more")
        if time_bucket_fn not in TIME_BUCKET_FNS:
            raise ValueError(f"time_bucket_fn={time_bucket_fn!r}; allowed: "
                             f"{', '.join(TIME_BUCKET_FNS)}")
        if use_time_encoding and num_time_buckets < 1:
            raise ValueError(f"num_time_buckets={num_time_buckets}; time encoding needs 1 or "
                             f"more")
        self.scale = math.sqrt(embedding_dim)
        self.use_time_encoding = use_time_encoding
        self.contextual = contextual_seq_len
        self.log_buckets = time_bucket_fn == "log"
        self.increments = float(time_bucket_increments)
        bound = math.sqrt(1.0 / num_position_buckets)
        self.position = nn.Parameter(
            torch.empty(num_position_buckets, embedding_dim).uniform_(-bound, bound))
        time_rows = num_time_buckets + 1 if use_time_encoding else 1
        bound = math.sqrt(1.0 / max(num_time_buckets, 1))
        self.time = nn.Parameter(torch.empty(time_rows, embedding_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, timestamps: torch.Tensor,
                num_targets: torch.Tensor | None = None) -> torch.Tensor:
        length = x.shape[1]
        buckets = self.position.shape[0]
        steps = torch.arange(length, device=x.device).unsqueeze(0)
        lengths = lengths.unsqueeze(1).to(steps.dtype)
        ends = lengths if num_targets is None else \
            lengths - num_targets.unsqueeze(1).to(steps.dtype)
        if not self.use_time_encoding:
            index = torch.minimum(steps, ends).clamp(max=buckets - 1)
            return x * self.scale + functional.embedding(index, self.position).to(x.dtype)
        index = ends - torch.minimum(steps, ends) + self.contextual
        index = index.clamp(max=buckets - 1)
        if self.contextual > 0:
            index[:, :self.contextual] = steps[:, :self.contextual]
        last = timestamps.gather(1, (lengths - 1).clamp(min=0))
        gap = (last - timestamps).clamp(min=1e-6) / self.increments
        gap = torch.log(gap) if self.log_buckets else torch.sqrt(gap)
        times = gap.clamp(min=0).to(torch.int32).clamp(max=self.time.shape[0] - 1)
        # functional.embedding, not indexing: positions of timestamp 0 (contextual tokens,
        # padding) all read the last time row, and indexing's backward accumulated such
        # duplicates one at a time (about 60x slower on an H100; bench_stu_ops.py).
        return x * self.scale + (functional.embedding(index, self.position)
                                 + functional.embedding(times.long(), self.time)).to(x.dtype)


class OutputPostprocessor(nn.Module):
    """TorchEasyRec's output postprocessors, each position alone: ``l2norm_postprocessor``
    x / max(|x|, 1e-6); ``layernorm_postprocessor`` LayerNorm (eps 1e-5);
    ``timestamp_layernorm_postprocessor`` x beside (cos, sin) of 2 * 3.14 * (the
    timestamp's units of each period, ``floor(t / unit)``, modulo the period's count) /
    count, through a linear layer, then LayerNorm.

    Shapes: x (B, L, D), timestamps (B, L) -> (B, L, D).
    """

    kind: str

    def __init__(self, kind: str, embedding_dim: int,
                 period_units: list[int], units_per_period: list[int]) -> None:
        super().__init__()
        if kind not in POSTPROCESSORS:
            raise ValueError(f"kind={kind!r}; allowed: {', '.join(POSTPROCESSORS)}")
        if len(period_units) != len(units_per_period):
            raise ValueError(f"{len(period_units)} period units and {len(units_per_period)} "
                             f"counts; give each period its count")
        self.kind = kind
        self.norm = nn.LayerNorm(embedding_dim, eps=1e-5)
        periods = len(period_units) if kind == POSTPROCESSORS[2] else 0
        self.register_buffer("period_units", torch.tensor(
            [float(u) for u in period_units[:periods]]).reshape(1, 1, periods))
        self.register_buffer("units_per_period", torch.tensor(
            [float(c) for c in units_per_period[:periods]]).reshape(1, 1, periods))
        self.combiner = nn.Linear(embedding_dim + 2 * periods, embedding_dim)
        nn.init.xavier_uniform_(self.combiner.weight)
        nn.init.zeros_(self.combiner.bias)

    def forward(self, x: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        if self.kind == "l2norm_postprocessor":
            return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=1e-6)
        if self.kind == "layernorm_postprocessor":
            return self.norm(x)
        units = torch.div(timestamps.unsqueeze(-1), self.period_units, rounding_mode="floor")
        angle = torch.remainder(units, self.units_per_period) / self.units_per_period \
            * 2 * 3.14
        circle = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).flatten(-2)
        return self.norm(self.combiner(torch.cat([x, circle.to(x.dtype)], dim=-1)))

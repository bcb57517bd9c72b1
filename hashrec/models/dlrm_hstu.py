"""DLRM HSTU: TorchEasyRec's generative ranking model (``dlrm_hstu``).

A row is a user's interaction history (UIH) and the candidates to rank for it. The
history (the SEQUENCE or JAGGED_SEQUENCE group "uih"), with its actions ("uih_action",
watch-time bits from "uih_watchtime") and timestamps ("uih_timestamp"), and the
candidates ("candidate", their request times "candidate_timestamp") go into one
sequence, after the contextual tokens (the DEEP group "contextual"): the input
preprocessor (``hashrec.modules.hstu_ranking``: content encoder and MLP, action encoder
and MLP, contextual tokens, optional interleaving), the positional encoder (the
candidates all at the position after the history), dropout, the STU layers
(``hashrec.modules.stu``), where each candidate reads the contextual tokens, the history
and itself alone (TorchEasyRec's ``num_targets``), and the output postprocessor on each
candidate's output. Each candidate's item embedding (its group's features through
Linear, x * sigmoid(LayerNorm(x)), Linear, LayerNorm) times that output goes through
the fusion tower (``fusion_mtl_tower``: an optional MLP, then one linear layer giving
every task's logits): the network's (B, K, T) logits, one row per candidate
(``hashrec.models.dlrm_hstu_net``).

Tasks (``fusion_mtl_tower.task_configs``) predict each candidate: a task's label column
(one of ``data_config.label_fields``) holds a list a row, one value per candidate
(TorchEasyRec's ``cand_seq__action_weight``); with ``task_bitmask`` the label is 1 where
the value has one of the bits, else 0. Losses and metrics are over the candidates: each
loss is the mean over the batch's candidates (jrc_loss's sessions: the candidates of
rows of one session id) (over every rank's with
``enable_global_average_loss``, as TorchEasyRec), times the task's weight, the losses
summed; predictions are ``probs_<task_name>`` (``y_`` with l2_loss) and
``logits_<task_name>``, one per candidate.

Where TorchEasyRec keeps histories and candidates jagged, HashRec pads them to their
features' ``sequence_length`` (K candidates a row) with length masks: a row's candidate
slots beyond its candidates weigh 0 in the losses and are left out of the metrics, so
every batch of B rows has one shape (the dense step CUDA-graphed).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.dlrm_hstu_net import DlrmHSTUNet, FusionTower, item_mlp
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import (
    DEEP,
    GroupSpec,
    deep_input,
    id_sequence_group,
    raw_sequence_groups,
    sequence_input,
)
from hashrec.models.hstu_build import (
    action_encoder,
    check_contextual_count,
    contextualized,
    stu_stack,
)
from hashrec.models.losses import session_index
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.rank_model import RankModel
from hashrec.modules.hstu_ranking import ContentEncoder, TargetPreprocessor
from hashrec.modules.mlp import MLP

WHERE = "dlrm_hstu"
HISTORY, CANDIDATE, CONTEXTUAL = "uih", "candidate", "contextual"
# The history's actions, watch times and timestamps (TorchEasyRec's group names), in the
# network's argument order; then the candidates' request times.
HISTORY_VALUES = ("uih_action", "uih_watchtime", "uih_timestamp")
CANDIDATE_TIMESTAMP = "candidate_timestamp"
VALUE_GROUPS = (*HISTORY_VALUES, CANDIDATE_TIMESTAMP)


class DlrmHSTU(RankModel):
    """See the module docstring; arguments as ``RankModel``."""

    # the history's and candidates' groups hold no query features
    sequence_query = False

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dlrm_hstu
        self.history_group = self._sequence_group(HISTORY)
        self.candidate_group = self._sequence_group(CANDIDATE)
        self.contextual_group = self._contextual_group(config.concat_contextual_features)
        self.value_groups = self._value_groups(config.hstu)
        self._check_groups()
        # each task's label bits (0: the label column's value itself)
        self.bitmasks = tuple(int(t.task_bitmask) for t in config.fusion_mtl_tower.task_configs)
        # K: a row's candidate slots
        self.candidates = self.candidate_group.sequence_length
        self.net = build_net(config, self.history_group, self.candidate_group,
                             self.contextual_group, sum(t.num_class for t in self.tasks))
        # every candidate slot is weighed: a row's padding by 0
        self.weighted = True
        # enable_global_average_loss false: each rank's losses are its candidates' mean
        self.local_loss_mean = not config.enable_global_average_loss

    # ---- feature groups ----

    def _sequence_group(self, name: str) -> GroupSpec:
        """The history or candidate group: SEQUENCE or JAGGED_SEQUENCE, of sequence
        features alone, one of them ids (its lengths)."""
        if name not in self.groups:
            raise ModelError(f"{WHERE}: feature group {name!r} is missing; dlrm_hstu reads "
                             f"the history from the group {HISTORY!r} and the candidates from "
                             f"{CANDIDATE!r} (TorchEasyRec's names), each a JAGGED_SEQUENCE "
                             f"group (groups: {', '.join(self.groups)})")
        return id_sequence_group(self.groups[name], WHERE)

    def _contextual_group(self, concat: bool) -> GroupSpec | None:
        """The DEEP group "contextual": a token a feature (all of one width), or one token
        of them all with ``concat_contextual_features``."""
        group = self.groups.get(CONTEXTUAL)
        if group is None:
            return None
        if group.group_type != DEEP or group.encoders:
            raise ModelError(f"{WHERE}: feature group {CONTEXTUAL!r} is the user's contextual "
                             f"features, a token each: it must be a DEEP group without "
                             f"sequence encoders (a SEQUENCE contextual group is not "
                             f"supported)")
        widths = {f.dim for f in group.features}
        if len(widths) > 1 and not concat:
            raise ModelError(f"{WHERE}: the features of feature group {CONTEXTUAL!r} are "
                             f"{sorted(widths)} wide; each is a token, so they must be of one "
                             f"width (or set concat_contextual_features: true for one token "
                             f"of them all)")
        return group

    def _value_groups(self, hstu) -> dict[str, GroupSpec]:
        """The history's actions, watch times and timestamps and the candidates' request
        times that the network reads, by group name; a group read by nothing is noted and
        left unread."""
        preprocessor = hstu.input_preprocessor
        kind = preprocessor.WhichOneof("input_preprocessor") or ""
        options = getattr(preprocessor, kind) if kind else None
        acts = options is not None and options.HasField("action_encoder")
        encoder = options.action_encoder.simple_action_encoder if acts else None
        timed = hstu.positional_encoder.use_time_encoding or \
            hstu.output_postprocessor.HasField("timestamp_layernorm_postprocessor")
        needs = {
            "uih_action": (acts, "input_preprocessor's action_encoder"),
            "uih_watchtime": (acts and len(encoder.watchtime_to_action_thresholds) > 0,
                              "simple_action_encoder.watchtime_to_action_thresholds"),
            "uih_timestamp": (timed, "positional_encoder.use_time_encoding (or the "
                                     "timestamp_layernorm_postprocessor)"),
            CANDIDATE_TIMESTAMP: (timed, "positional_encoder.use_time_encoding (or the "
                                         "timestamp_layernorm_postprocessor)"),
        }
        return raw_sequence_groups(self.groups, needs, f"{WHERE}.hstu", "config")

    def _check_groups(self) -> None:
        known = (HISTORY, CANDIDATE, CONTEXTUAL, *VALUE_GROUPS)
        unknown = [n for n in self.groups if n not in known]
        if unknown:
            raise ModelError(f"{WHERE}: feature groups {unknown} are not read by dlrm_hstu and "
                             f"would be left out of the model; remove them (it reads "
                             f"{', '.join(known)}, TorchEasyRec's names)")

    # ---- the dense network ----

    def candidate_counts(self, batch) -> torch.Tensor:
        """Each row's candidates (B,) int64: the candidate group's id features' longest,
        at most K."""
        rows = batch.batch_size
        lengths = None
        for info in self.candidate_group.sequence:
            if info.embedded:
                own = batch.sparse[info.name].lengths[:rows]
                lengths = own if lengths is None else torch.maximum(lengths, own)
        return lengths.clamp(max=self.candidates)

    def candidate_mask(self, batch) -> torch.Tensor:
        """Which of the B * K candidate slots hold a candidate (B * K,) bool."""
        steps = torch.arange(self.candidates, device=batch.sparse.device)
        return (steps.unsqueeze(0) < self.candidate_counts(batch).unsqueeze(1)).reshape(-1)

    def _values(self, name: str, embedded, batch, rows: int, length: int) -> torch.Tensor:
        """One value group's (B, length) values, zeros where unread."""
        group = self.value_groups.get(name)
        if group is None:
            return torch.zeros(rows, length, device=batch.sparse.device)
        _, values, _ = sequence_input(group, embedded, batch)
        values = values[:rows, :length, 0]
        return torch.nn.functional.pad(values, (0, length - values.shape[1]))

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The history (B, L, Du) and its lengths (B,), the contextual features (B, C Dx)
        ((B, 0) without), the actions, watch times and timestamps (B, L), the candidates
        (B, K, Dt), their counts (B,) and request times (B, K)."""
        rows = batch.batch_size
        _, history, lengths = sequence_input(self.history_group, embedded, batch)
        history, lengths = history[:rows], lengths[:rows]
        if self.contextual_group is not None:
            contextual = deep_input(self.contextual_group, embedded, batch)[:rows]
        else:
            contextual = history.new_zeros(rows, 0)
        values = [self._values(name, embedded, batch, rows, history.shape[1])
                  for name in HISTORY_VALUES]
        _, candidates, counts = sequence_input(self.candidate_group, embedded, batch)
        candidates = candidates[:rows, :self.candidates]
        candidates = torch.nn.functional.pad(
            candidates, (0, 0, 0, self.candidates - candidates.shape[1]))
        times = self._values(CANDIDATE_TIMESTAMP, embedded, batch, rows, self.candidates)
        return (history, lengths, contextual, *values, candidates,
                counts[:rows].clamp(max=self.candidates), times)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> logits (B * K, T): candidate slot j of row b is row
        b * K + j, every task's logits side by side."""
        logits = self.net(*inputs)
        return logits.reshape(-1, logits.shape[-1])

    # ---- outputs, targets ----

    def batch_predictions(self, logits: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        """Each task's outputs, one per candidate slot (B * K,), with
        ``candidate_mask`` (B * K,) the slots that hold a candidate (what the metrics
        count) and, where the batch has labels, ``candidate_label_<task_name>`` each
        slot's label (what the metrics read)."""
        out = self.predictions(logits)
        out["candidate_mask"] = self.candidate_mask(batch)
        if all(task.label_name in batch.labels for task in self.tasks):
            labels = self.labels(batch)
            for i, task in enumerate(self.tasks):
                out["candidate_label" + task.suffix] = labels[:, i]
        return out

    def labels(self, batch) -> torch.Tensor:
        """Each candidate slot's label of each task (B * K, T) float32: the task's label
        column's value (a list a row) at the candidate, with ``task_bitmask`` 1 where it
        has one of the bits (else 0); 0 in the padding."""
        columns = []
        for task, bits in zip(self.tasks, self.bitmasks):
            values = self._target(batch, task.label_name, "label")
            if values.dim() != 2:
                raise ModelError(f"{WHERE}: label {task.label_name!r} holds one value a row; "
                                 f"dlrm_hstu reads a list a row, one value per candidate")
            values = values[:, :self.candidates]
            values = torch.nn.functional.pad(values, (0, self.candidates - values.shape[1]))
            if bits:
                values = (torch.bitwise_and(values.long(), bits) > 0).float()
            columns.append(values.reshape(-1))
        return torch.stack(columns, dim=-1)

    def session_ids(self, batch) -> torch.Tensor | None:
        """Each candidate slot's session of each jrc_loss session feature
        (B * K, sessions) int64: its row's (its first id, as ``RankModel``'s), numbered
        by ``session_index`` so that a row's padding slots get numbers of their own (no
        candidate competes with them); None without a jrc_loss task."""
        rows = super().session_ids(batch)
        if rows is None:
            return None
        mask = self.candidate_mask(batch)
        columns = []
        for i in range(rows.shape[1]):
            ids = rows[:batch.batch_size, i].repeat_interleave(self.candidates)
            columns.append(_candidate_sessions(session_index(ids), mask))
        return torch.stack(columns, dim=-1)

    def sample_weights(self, batch) -> torch.Tensor:
        """Each candidate slot's loss weight of each task (B * K, T): 1 for a candidate,
        0 for a row's padding."""
        mask = self.candidate_mask(batch).float()
        return mask.unsqueeze(1).expand(-1, len(self.tasks)).contiguous()


def _candidate_sessions(numbers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Session numbers (N,) in [0, N) of every slot -> the candidates' renumbered to
    [0, D) (D their sessions), each padding slot (``mask`` false) a number of its own
    after them; no host reads."""
    used = torch.zeros_like(numbers).scatter_reduce(0, numbers, mask.long(), "amax")
    compact = torch.cumsum(used, 0) - 1
    padding = used.sum() + torch.cumsum(torch.logical_not(mask).long(), 0) - 1
    return torch.where(mask, compact[numbers], padding)


def build_net(config, history: GroupSpec, candidate: GroupSpec, contextual: GroupSpec | None,
              logits: int) -> DlrmHSTUNet:
    """The network of ``dlrm_hstu`` ``config`` over its groups, ``logits`` its tasks'
    logits a candidate."""
    where = f"{WHERE}.hstu"
    hstu = config.hstu
    stu = hstu.stu
    dim = int(stu.embedding_dim)
    count, width = _contextual_shape(contextual, config.concat_contextual_features)
    check_contextual_count(stu, count, where, CONTEXTUAL)
    scaling = stu.scaling_seqlen if stu.scaling_seqlen > 0 else config.max_seq_len
    try:
        preprocessor = _preprocessor(hstu, history.sequence_dim, candidate.sequence_dim, dim,
                                     count, width)
        positional, layers, postprocessor = stu_stack(hstu, dim, count, int(scaling))
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err
    items = item_mlp(candidate.sequence_dim, int(config.item_embedding_hidden_dim), dim)
    tower = config.fusion_mtl_tower
    mlp, tower_width = optional_mlp(tower, "mlp", dim, f"{WHERE}.fusion_mtl_tower.mlp")
    fusion = FusionTower(mlp if mlp is not None else nn.Identity(), tower_width, logits)
    return DlrmHSTUNet(preprocessor, positional, layers, postprocessor, items, fusion,
                       proto_float(hstu.input_dropout_ratio), count, int(stu.max_attn_len),
                       bool(config.sequence_timestamp_is_ascending))


def _contextual_shape(group: GroupSpec | None, concat: bool) -> tuple[int, int]:
    """(C tokens, each token's input width) of the contextual group."""
    if group is None or not group.features:
        return 0, 0
    if concat:
        return 1, sum(f.dim for f in group.features)
    return len(group.features), group.features[0].dim


def _preprocessor(hstu, history_dim: int, candidate_dim: int, dim: int, count: int,
                  width: int) -> TargetPreprocessor:
    """The input preprocessor (``contextual_preprocessor`` or
    ``contextual_interleave_preprocessor``) of ``hstu``."""
    kind = hstu.input_preprocessor.WhichOneof("input_preprocessor")
    if kind not in ("contextual_preprocessor", "contextual_interleave_preprocessor"):
        raise ValueError(f"input_preprocessor.{kind} is not a dlrm_hstu preprocessor; use "
                         f"contextual_preprocessor or contextual_interleave_preprocessor")
    options = getattr(hstu.input_preprocessor, kind)
    content = _content_encoder(options.content_encoder, history_dim, candidate_dim)
    content_mlp = _contextualized(options.content_mlp, content.output_dim, dim, count * width)
    actions = action_mlp = None
    if options.HasField("action_encoder"):
        actions = action_encoder(options.action_encoder)
        action_mlp = _contextualized(options.action_mlp, actions.output_dim, dim,
                                     count * width)
    interleave = kind == "contextual_interleave_preprocessor" and options.enable_interleaving
    return TargetPreprocessor(content, content_mlp, dim, count, width, actions, action_mlp,
                              interleave)


def _content_encoder(config, history_dim: int, candidate_dim: int) -> ContentEncoder:
    kind = config.WhichOneof("content_encoder") or ""
    if kind != "mlp_content_encoder":
        return ContentEncoder(kind, history_dim, candidate_dim)
    options = config.mlp_content_encoder
    history = MLP(history_dim, mlp_options(options.uih_mlp, "mlp_content_encoder.uih_mlp"))
    target = MLP(candidate_dim, mlp_options(options.target_mlp,
                                            "mlp_content_encoder.target_mlp"))
    if history.output_dim() != target.output_dim():
        raise ValueError(f"mlp_content_encoder: uih_mlp gives {history.output_dim()} values "
                         f"and target_mlp {target.output_dim()}; they must agree")
    return ContentEncoder(kind, history_dim, candidate_dim, history, target,
                          history.output_dim())


def _contextualized(config, input_dim: int, output_dim: int, contextual_dim: int
                    ) -> nn.Module:
    kind = config.WhichOneof("contextualized_mlp") or ""
    if not kind:
        raise ValueError("a contextualized MLP sets no MLP; use simple_mlp { hidden_dim } or "
                         "parameterized_mlp { hidden_dim }")
    return contextualized(config, kind, input_dim, output_dim, contextual_dim)

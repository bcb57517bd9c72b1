"""HSTU match: TorchEasyRec's HSTU two-tower match (retrieval) model (``hstu_match``).

The user tower (``hashrec.models.hstu_towers.HSTUUserTower``) reads the user's
interaction history (UIH), the SEQUENCE or JAGGED_SEQUENCE group ``user_tower.input``
(conventionally "uih"; sequence features alone): the UIH preprocessor projects each
position to ``stu.embedding_dim`` D and adds its actions (``action_encoder`` over the
group "uih_action", with watch-time bits from "uih_watchtime"); the DEEP group
"contextual", if any, gives one token per feature before the history; the positional
encoder adds position (and, with ``use_time_encoding``, time-gap from the group
"uih_timestamp") embeddings; dropout; ``attn_num_layers`` STU layers
(``hashrec.modules.stu``); the output postprocessor. The user is the last position of
the row, then a linear layer to ``output_dim`` where set, L2-normalized under COSINE.

The item tower (``HSTUItemTower``) embeds each candidate item (the group
``item_tower.input``) by the optional MLP, a linear layer to ``output_dim`` where set,
L2-normalized under COSINE. A candidate group that is a sequence (TorchEasyRec's
JAGGED_SEQUENCE "candidate", such as ``cand_seq__video_id``) holds the row's K
positives; a DEEP group one positive a row.

Training and evaluation, as TorchEasyRec's HSTUMatch: every positive of a row is a
query of the row's user; its similarity to the positive is column 0, then its
similarities to the negative sampler's N items, shared by all queries (and a
hard-negative sampler's row's own, -inf in empty slots), all over ``temperature``:
(B * K, 1 + N [+ H]). The loss is the softmax cross entropy of each query picking its
positive, averaged over the queries (a row's sample weight weighs each of its queries);
``recall_at_k`` is the share of queries whose positive is among the k highest. Only the
last history position is a user: the histories are not trained autoregressively.
In-batch negatives are refused, as in TorchEasyRec.

Where TorchEasyRec keeps the histories and candidates jagged, HashRec pads them to
fixed lengths (the features' ``sequence_length``) with a length mask: a row's K
candidate positions beyond its positives are queries of weight 0, left out of the loss
and the metrics (``query_mask``), so that every batch of B rows has the same shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import (
    DEEP,
    GroupSpec,
    deep_input,
    id_sequence_group,
    raw_sequence_groups,
    sequence_input,
)
from hashrec.models.group_encoders import input_count
from hashrec.models.hstu_build import (
    action_encoder,
    check_contextual_count,
    contextualized,
    stu_stack,
)
from hashrec.models.hstu_towers import HSTUItemTower, HSTUUserTower, candidate_similarity
from hashrec.models.match import batch_similarity, hard_negative_input, split_hard_negatives
from hashrec.models.match_model import MatchModel
from hashrec.models.mlp_config import optional_mlp
from hashrec.modules.hstu_inputs import UIHPreprocessor

WHERE = "hstu_match"
CONTEXTUAL = "contextual"
# The groups of the history's actions, watch times and timestamps (TorchEasyRec's names),
# in the user tower's argument order.
AUX_GROUPS = ("uih_action", "uih_watchtime", "uih_timestamp")


class HSTUMatch(MatchModel):
    """See the module docstring; arguments as ``RankModel``."""

    # the history's group holds no query features
    sequence_query = False

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.hstu_match
        if self.in_batch_negative:
            raise ModelError(f"{WHERE}.in_batch_negative is not supported (as in "
                             f"TorchEasyRec); set data_config.negative_sampler")
        hstu = config.user_tower.hstu
        self.user_group = self._sequence_group(config.user_tower.input, "user_tower.input")
        self.contextual_group = self._contextual_group()
        self.aux_groups = self._aux_groups(hstu)
        self.item_group = self._item_group(config.item_tower.input)
        self._check_groups()
        self.user_tower = _user_tower(config, self.user_group, self.contextual_group,
                                      self.output_dim, self.cosine)
        self.item_tower = self._item_tower(config.item_tower)
        self._check_widths(self.user_tower.dim, self.item_tower.dim)
        # every query is weighed: the padding of a row's candidates by 0
        self.weighted = True
        self._item_inputs = input_count(self.item_group, self.sequence_encoders) \
            if self.item_group.group_type == DEEP else 1

    # ---- feature groups ----

    def _sequence_group(self, name: str, field: str) -> GroupSpec:
        """The history (or a sequence candidate) group: SEQUENCE or JAGGED_SEQUENCE, of
        sequence features alone, one of them ids (its lengths)."""
        if name not in self.groups:
            raise ModelError(f"{WHERE}.{field}: input {name!r} is not a feature group "
                             f"(groups: {', '.join(self.groups)})")
        return id_sequence_group(self.groups[name], f"{WHERE}.{field}")

    def _contextual_group(self) -> GroupSpec | None:
        """The DEEP group "contextual": one token a feature, all of one width."""
        group = self.groups.get(CONTEXTUAL)
        if group is None:
            return None
        if group.group_type != DEEP or group.encoders:
            raise ModelError(f"{WHERE}: feature group {CONTEXTUAL!r} is the user's contextual "
                             f"features, a token each: it must be a DEEP group without "
                             f"sequence encoders")
        widths = {f.dim for f in group.features}
        if len(widths) > 1:
            raise ModelError(f"{WHERE}: the features of feature group {CONTEXTUAL!r} are "
                             f"{sorted(widths)} wide; each is a token, so they must be of "
                             f"one width (as in TorchEasyRec)")
        return group

    def _aux_groups(self, hstu) -> dict[str, GroupSpec]:
        """The history's actions, watch times and timestamps that the user tower reads,
        by group name; a group read by nothing is noted and left unread."""
        encoder = hstu.input_preprocessor.uih_preprocessor.action_encoder
        needs = {
            "uih_action": (hstu.input_preprocessor.uih_preprocessor.HasField("action_encoder"),
                           "input_preprocessor.uih_preprocessor.action_encoder"),
            "uih_watchtime": (len(encoder.simple_action_encoder.watchtime_to_action_thresholds)
                              > 0, "its simple_action_encoder.watchtime_to_action_thresholds"),
            "uih_timestamp": (
                hstu.positional_encoder.use_time_encoding
                or hstu.output_postprocessor.HasField("timestamp_layernorm_postprocessor"),
                "positional_encoder.use_time_encoding (or the "
                "timestamp_layernorm_postprocessor)"),
        }
        return raw_sequence_groups(self.groups, needs, f"{WHERE}.user_tower.hstu",
                                   "user tower's config")

    def _item_group(self, name: str) -> GroupSpec:
        field = "item_tower.input"
        if name in self.groups and self.groups[name].group_type == DEEP:
            return self.groups[name]
        return self._sequence_group(name, field)

    def _check_groups(self) -> None:
        read = [self.user_group.name, self.item_group.name, *self.aux_groups]
        if self.contextual_group is not None:
            read.append(CONTEXTUAL)
        if self.user_group.name == self.item_group.name:
            raise ModelError(f"{WHERE}: the user and item towers read one feature group "
                             f"{self.user_group.name!r}; give each tower its own")
        unread = [n for n in self.groups if n not in read and n not in AUX_GROUPS]
        if unread:
            raise ModelError(f"{WHERE}: feature groups {unread} feed no tower and would be "
                             f"left out of the model; remove them (the user tower reads "
                             f"user_tower.input, {CONTEXTUAL!r} and {', '.join(AUX_GROUPS)})")

    def _item_tower(self, tower) -> HSTUItemTower:
        group = self.item_group
        width = group.dim if group.group_type == DEEP else group.sequence_dim
        mlp, width = optional_mlp(tower, "mlp", width, f"{WHERE}.item_tower.mlp") \
            if len(tower.mlp.hidden_units) else (None, width)
        output: nn.Module = nn.Identity()
        if self.output_dim > 0:
            output = nn.Linear(width, self.output_dim)
            width = self.output_dim
        return HSTUItemTower(mlp if mlp is not None else nn.Identity(), output, self.cosine,
                             width)

    # ---- the dense network ----

    def candidate_lengths(self, batch) -> torch.Tensor:
        """Each row's positives (B,) int64: 1 a row of a DEEP candidate group; a sequence
        group's length (its id features' longest, at most its positions)."""
        rows = batch.batch_size
        group = self.item_group
        if group.group_type == DEEP:
            return torch.ones(rows, dtype=torch.int64, device=batch.sparse.device)
        lengths = None
        for info in group.sequence:
            if info.embedded:
                own = batch.sparse[info.name].lengths[:rows]
                lengths = own if lengths is None else torch.maximum(lengths, own)
        return lengths.clamp(max=group.sequence_length)

    def query_mask(self, batch) -> torch.Tensor:
        """Which of the B * K queries are a row's positives (B * K,) bool."""
        count = 1 if self.item_group.group_type == DEEP else self.item_group.sequence_length
        steps = torch.arange(count, device=batch.sparse.device)
        return (steps.unsqueeze(0) < self.candidate_lengths(batch).unsqueeze(1)).reshape(-1)

    def _aux_input(self, name: str, embedded, batch, rows: int, length: int) -> torch.Tensor:
        """A history's actions, watch times or timestamps (B, L), zeros where unread."""
        group = self.aux_groups.get(name)
        device = batch.sparse.device
        if group is None:
            return torch.zeros(rows, length, device=device)
        _, values, _ = sequence_input(group, embedded, batch)
        values = values[:rows, :length, 0]
        return torch.nn.functional.pad(values, (0, length - values.shape[1]))

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The history (B, L, Du) and its lengths (B,), the contextual features (B, C Dc)
        ((B, 0) without), the actions, watch times and timestamps (B, L) over the batch's
        B rows; then the candidate group's over its B + N rows: a sequence group's
        (B + N, K, Dc), a DEEP group's tensors; the hard-negative mask, if any."""
        rows = batch.batch_size
        _, history, lengths = sequence_input(self.user_group, embedded, batch)
        history, lengths = history[:rows], lengths[:rows]
        if self.contextual_group is not None:
            contextual = deep_input(self.contextual_group, embedded, batch)[:rows]
        else:
            contextual = history.new_zeros(rows, 0)
        aux = [self._aux_input(name, embedded, batch, rows, history.shape[1])
               for name in AUX_GROUPS]
        if self.item_group.group_type == DEEP:
            items = self.group_inputs([self.item_group], embedded, batch)
        else:
            items = (sequence_input(self.item_group, embedded, batch)[1],)
        return (history, lengths, contextual, *aux, *items, *hard_negative_input(batch))

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> similarities / temperature (B * K, 1 + N [+ H]), query
        b * K + j the row's positive j (column 0), then the negatives."""
        inputs, hard = split_hard_negatives(inputs)
        user = self.user_tower(*inputs[:6])
        items = inputs[6:]
        if self.item_group.group_type == DEEP:
            (item,) = self.groups_from_inputs([self.item_group], items)
            similarity = batch_similarity(user, self.item_tower(item), False, hard)
        else:
            rows = user.shape[0]
            positives = self.item_tower(items[0][:rows])
            negatives = self.item_tower(items[0][rows:, 0])
            mask = hard if hard is not None else \
                torch.zeros(0, dtype=torch.bool, device=user.device)
            similarity = candidate_similarity(user, positives, negatives, mask,
                                              hard is not None)
        return similarity / self.temperature

    # ---- outputs, targets ----

    def batch_predictions(self, logits: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        """{"similarity": (B * K, S), "query_mask": (B * K,) the queries that are
        positives (what ``recall_at_k`` counts)}."""
        return {"similarity": logits, "query_mask": self.query_mask(batch)}

    def labels(self, batch) -> torch.Tensor:
        """Zeros (B * K,): each query's positive is its column 0 (the label columns are
        not read, as TorchEasyRec's loss reads none of their values)."""
        return torch.zeros(self.query_mask(batch).shape[0], device=batch.sparse.device)

    def targets(self, batch) -> tuple[torch.Tensor, ...]:
        """(zero labels (B * K,), each query's weight (B * K,)): 1 for a positive (times
        its row's sample weight, with one), 0 for a row's padding."""
        mask = self.query_mask(batch)
        weights = mask.float()
        task = self.tasks[0]
        if task.sample_weight_name:
            rows = self._target(batch, task.sample_weight_name, "sample weight")
            weights = (weights.reshape(rows.shape[0], -1) * rows.unsqueeze(1)).reshape(-1)
        return torch.zeros_like(weights), weights


def _user_tower(config, history: GroupSpec, contextual: GroupSpec | None, output_dim: int,
                cosine: bool) -> HSTUUserTower:
    """The user tower of ``hstu_match`` ``config`` over the ``history`` group (and the
    ``contextual`` group)."""
    where = f"{WHERE}.user_tower.hstu"
    hstu = config.user_tower.hstu
    stu = hstu.stu
    count = len(contextual.features) if contextual is not None else 0
    width = contextual.features[0].dim if count else 0
    check_contextual_count(stu, count, where, CONTEXTUAL)
    dim = int(stu.embedding_dim)
    scaling = stu.scaling_seqlen if stu.scaling_seqlen > 0 else config.user_tower.max_seq_len
    try:
        preprocessor = UIHPreprocessor(history.sequence_dim, dim, count, width,
                                       *_actions(hstu, dim, count * width, where))
        positional, layers, postprocessor = stu_stack(hstu, dim, count, int(scaling))
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err
    output: nn.Module = nn.Linear(dim, output_dim) if output_dim > 0 else nn.Identity()
    return HSTUUserTower(preprocessor, positional, layers, postprocessor, output,
                         proto_float(hstu.input_dropout_ratio), count, int(stu.max_attn_len),
                         cosine, bool(config.sequence_timestamp_is_ascending),
                         output_dim if output_dim > 0 else dim)


def _actions(hstu, dim: int, contextual_dim: int, where: str
             ) -> tuple[nn.Module | None, nn.Module | None]:
    """The UIH preprocessor's action encoder and action MLP (None, None without)."""
    uih = hstu.input_preprocessor.uih_preprocessor
    if not uih.HasField("action_encoder"):
        return None, None
    encoder = action_encoder(uih.action_encoder)
    kind = uih.action_mlp.WhichOneof("contextualized_mlp")
    if kind is None:
        raise ModelError(f"{where}.input_preprocessor.uih_preprocessor.action_mlp sets no MLP")
    return encoder, contextualized(uih.action_mlp, kind, encoder.output_dim, dim,
                                   contextual_dim)

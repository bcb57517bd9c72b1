"""Shared plumbing of ranking models: embeddings, feature groups, loss.

A ranking model owns an ``EmbeddingCollection`` (dense and dynamic tables with
a fused sparse optimizer) and a dense network. Embedding lookups always run in
float32, outside any autocast region the trainer opens; only the dense network
runs in reduced precision under mixed precision training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import GroupSpec, build_group_spec, feature_infos
from hashrec.models.group_encoders import (
    build_group_encoders,
    group_from_inputs,
    group_inputs,
    input_count,
)
from hashrec.models.losses import task_loss
from hashrec.models.outputs import split_task_logits, task_outputs
from hashrec.models.tasks import (
    FUSION_MODELS,
    MULTI_TASK_MODELS,
    model_tasks,
    pareto_min_weights,
)

logger = logging.getLogger(__name__)


class RankModel(nn.Module):
    """Base of ranking models (``num_class`` logits per row and task, see
    ``hashrec.models.tasks``).

    Args:
        model_config: the pipeline's ``ModelConfig`` message.
        feature_set: the ``FeatureSet`` built from the pipeline config (the features the
            feature groups name; ``left_out`` lists the others, logged once here).
        sparse_optimizer: optimizer spec of the embedding tables (hashrec.table).
        device: where the embedding tables live (the trainer moves the dense part).
        embedding: a prebuilt embedding module (``EmbeddingCollection`` interface);
            None builds an ``EmbeddingCollection`` from ``feature_set``.

    Subclasses implement ``dense_inputs`` and ``dense_from_inputs``: logits (B,), (B, C)
    of a model of C classes, or (B, logits) of a multi-task model, each task's
    ``num_class`` columns in task order.
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__()
        # What each logit predicts (hashrec.models.tasks): one task, on label_fields[0],
        # for a single-task model.
        self.tasks = model_tasks(model_config, feature_set.label_fields,
                                 getattr(feature_set, "sample_weight_fields", ()))
        # The tasks of the outputs, in logit order (a PEPNet's towers per domain have
        # each task once per domain): what the forward and the export give.
        self.output_tasks = self.tasks
        self.multi_task = model_config.WhichOneof("model") in MULTI_TASK_MODELS + FUSION_MODELS
        self.label_name = self.tasks[0].label_name
        # Whether the losses are weighted means over the rows (``sample_weights``).
        self.weighted = any(task.row_weighted for task in self.tasks)
        # The keys of the losses, in task order (a task's in its ``losses`` order).
        self.losses = tuple(name for task in self.tasks for name in task.loss_names)
        # The keys of the losses an evaluation reports (a model that trains on more, such
        # as RocketLaunching's booster, sets its own).
        self.eval_losses = self.losses
        # With model_config.use_pareto_loss_weight, the least Pareto weight of each loss of
        # ``losses`` (the trainer weighs them, hashrec.train.pareto); None: they are summed.
        self.pareto_min_weights = pareto_min_weights(model_config, self.tasks)
        # A single-task model's l2_loss makes it a regression model, whose prediction
        # ``y`` is the logit itself; binary_cross_entropy: a classifier, whose prediction
        # ``probs`` is its sigmoid.
        self.regression = self.tasks[0].regression
        self.prediction = self.tasks[0].prediction
        # A single-task model's logits a row (its output layer's width).
        self.num_class = self.tasks[0].num_class
        # The id features whose first id per row is a jrc_loss task's session, once each
        # (the targets carry their ids, ``session_ids``).
        self.session_names = tuple(dict.fromkeys(
            spec.session_name for t in self.tasks for spec in t.losses
            if spec.name == "jrc_loss"))
        self.groups = self._build_groups(model_config, feature_set)
        # The DEEP groups' sequence encoders (hashrec.models.group_encoders), by group.
        self.sequence_encoders = build_group_encoders(self.groups)
        if embedding is None:
            from hashrec.embedding import EmbeddingCollection

            embedding = EmbeddingCollection(
                feature_set.embedding_tables(), feature_set.embedding_features(),
                sparse_optimizer, device)
        self.embedding = embedding

    # Whether a SEQUENCE group must hold query features (a DIN's target); MIND reads a
    # behaviour sequence alone.
    sequence_query = True

    def _build_groups(self, model_config, feature_set) -> dict[str, GroupSpec]:
        infos = feature_infos(feature_set)
        groups: dict[str, GroupSpec] = {}
        for group_config in model_config.feature_groups:
            if group_config.group_name in groups:
                raise ModelError(f"feature group {group_config.group_name!r} is defined twice")
            groups[group_config.group_name] = build_group_spec(group_config, infos,
                                                               feature_set.left_out,
                                                               self.sequence_query)
        if feature_set.left_out:
            logger.info("features in no feature group, left out (not read from the input, "
                        "not embedded, no table of their own): %s; add them to a "
                        "feature group to use them", ", ".join(feature_set.left_out))
        return groups

    def group(self, name: str, expected_type: str, where: str) -> GroupSpec:
        """The group ``name`` checked to be of ``expected_type``.

        Raises:
            ModelError: no such group or wrong type; names ``where`` (the tower).
        """
        if name not in self.groups:
            raise ModelError(
                f"{where}: input {name!r} is not a feature group (groups: "
                f"{', '.join(self.groups) or 'none'})")
        group = self.groups[name]
        if group.group_type != expected_type:
            raise ModelError(
                f"{where}: feature group {name!r} is {group.group_type}, expected "
                f"{expected_type}")
        return group

    def group_inputs(self, groups: Sequence[GroupSpec], embedded,
                     batch) -> tuple[torch.Tensor, ...]:
        """The tensors of DEEP (or WIDE) ``groups``, one after another, from which
        ``groups_from_inputs`` builds each group's (B, group.dim) inside the dense
        network: one tensor a group, or more where it has sequence encoders."""
        return tuple(t for group in groups
                     for t in group_inputs(group, self.groups, embedded, batch))

    def groups_from_inputs(self, groups: Sequence[GroupSpec],
                           inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each of ``groups`` (B, group.dim) from ``inputs``, which begin with their
        ``group_inputs``."""
        out, at = [], 0
        for group in groups:
            count = input_count(group, self.sequence_encoders)
            out.append(group_from_inputs(group, inputs[at:at + count], self.sequence_encoders))
            at += count
        return out

    def embed(self, batch, embedding_hook=None):
        """Embedding lookups in float32 (autocast is switched off here), then
        ``embedding_hook`` (see :meth:`forward`) when given."""
        device_type = batch.sparse.device.type
        with torch.autocast(device_type=device_type, enabled=False):
            embedded = self.embedding(batch.sparse)
        return embedded if embedding_hook is None else embedding_hook(embedded)

    def dense_forward(self, embedded, batch) -> torch.Tensor:
        """The dense network: embedding output -> logits (see ``dense_from_inputs``)."""
        return self.dense_from_inputs(*self.dense_inputs(embedded, batch))

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The dense network's inputs as a flat tuple of tensors (group inputs built from
        the embedding output and the batch): what a CUDA graph of the dense network
        takes (``hashrec.train.graphs``)."""
        raise NotImplementedError

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> logits (B,), (B, C) or (B, logits of every task); only tensor
        ops of fixed shapes, no host reads."""
        raise NotImplementedError

    def dense_modules(self) -> list[nn.Module]:
        """The submodules holding the dense network's parameters (all but the embedding)."""
        return [m for name, m in self.named_children() if name != "embedding"]

    def forward(self, batch, embedding_hook=None) -> dict[str, torch.Tensor]:
        """Batch -> {"logits": (B,) float32, "probs": (B,) float32}; a regression model
        (l2_loss) gives {"logits", "y"}, ``y`` the logits themselves; a model of C > 1
        classes {"logits": (B, C), "probs": (B, C) their softmax} and with two classes
        "probs1": probs[:, 1]. A multi-task model gives each task's outputs with the
        suffix ``_<tower_name>`` (``Task.outputs``).

        Args:
            batch: a ``Batch`` on the model's device.
            embedding_hook: optional map applied to the embedding output before the
                dense network (the trainer's FP16 gradient unscaling).
        """
        logits = self.dense_forward(self.embed(batch, embedding_hook), batch).float()
        return self.batch_predictions(logits, batch)

    def task_logits(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """The dense network's logits -> each task's: (B,) for one logit, (B, C) for C
        classes."""
        return split_task_logits(logits, [t.num_class for t in self.tasks], self.multi_task)

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The dense network's logits -> each task's outputs (``forward``)."""
        return task_outputs(self.task_logits(logits), [t.suffix for t in self.tasks],
                            [t.regression for t in self.tasks])

    def batch_predictions(self, logits: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        """The outputs of ``batch``'s logits, what the metrics read: ``predictions``,
        and whatever of them depends on the batch's labels (a PEPNet's towers per
        domain: each task's outputs of the row's domain)."""
        return self.predictions(logits)

    def labels(self, batch) -> torch.Tensor:
        """The batch's (B,) float32 labels of ``label_fields[0]``; a multi-task model's
        (B, tasks), each task's label column in task order."""
        if not self.multi_task:
            return self._target(batch, self.label_name, "label")
        return torch.stack([self._target(batch, task.label_name, "label")
                            for task in self.tasks], dim=-1)

    def sample_weights(self, batch) -> torch.Tensor | None:
        """The batch's float32 row loss weights: (B,), or (B, tasks) of a multi-task
        model, a task's column its sample weight (``Task.sample_weight_name``; 1 without)
        times its task-space factor; None where no task weighs its rows."""
        if not self.weighted:
            return None
        columns = [self._task_weights(batch, task) for task in self.tasks]
        return torch.stack(columns, dim=-1) if self.multi_task else columns[0]

    def _task_weights(self, batch, task) -> torch.Tensor:
        """One task's row weights (B,)."""
        weights = self._target(batch, task.sample_weight_name, "sample weight") \
            if task.sample_weight_name else None
        if task.task_space_label:
            indicator = self._target(batch, task.task_space_label, "label")
            space = torch.full_like(indicator, task.in_task_space_weight).where(
                indicator > 0, task.out_task_space_weight)
            weights = space if weights is None else weights * space
        if weights is None:
            weights = torch.ones_like(self._target(batch, task.label_name, "label"))
        return weights

    def session_ids(self, batch) -> torch.Tensor | None:
        """The batch's (B, len(session_names)) int64 session ids of the jrc_loss tasks: a
        row's first id of each session feature, 0 for a row without one (as TorchEasyRec
        reads a grouping feature); None without a jrc_loss task.

        Raises:
            ModelError: the batch has no such feature (a feature config names it?).
        """
        if not self.session_names:
            return None
        columns = []
        for name in self.session_names:
            if name not in batch.sparse.keys():
                raise ModelError(f"jrc_loss session_name {name!r} is not a feature of the "
                                 f"batch (sparse features: {', '.join(batch.sparse.keys())}); "
                                 f"name an id feature of feature_configs")
            columns.append(first_ids(batch.sparse[name]))
        return torch.stack(columns, dim=-1)

    def targets(self, batch) -> tuple[torch.Tensor, ...]:
        """What the loss reads besides the logits: the labels, then the row weights where
        the tasks weigh rows (``weighted``), then the session ids where a task trains on
        jrc_loss (``session_ids``); labels and weights (B,) or (B, tasks) each."""
        weights = self.sample_weights(batch)
        sessions = self.session_ids(batch)
        return (self.labels(batch), *(t for t in (weights, sessions) if t is not None))

    @property
    def target_count(self) -> int:
        """How many tensors ``targets`` gives."""
        return 1 + int(self.weighted) + int(bool(self.session_names))

    def target_weights(self, targets: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        """The row weights among ``targets`` (``targets(batch)``), None without: (B,) of a
        single-task model (its every loss's), else (B, losses), a column per loss of
        ``losses`` (its task's weights)."""
        if not self.weighted:
            return None
        weights = targets[1]
        if weights.dim() == 1 or weights.shape[1] == len(self.losses):
            return weights
        # slices, not an index tensor: nothing is copied to the device
        return torch.cat([weights[:, i:i + 1].expand(-1, len(task.losses))
                          for i, task in enumerate(self.tasks)], dim=1)

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           *rest: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-loss scalar tensors (float32) of the dense network's logits and the
        ``targets``, ``labels`` then ``rest`` (the weights, the session ids, as
        ``targets`` gives them); a multi-task model's task losses are each multiplied by
        the task's weight; a task of several losses has each under its key. See
        :func:`hashrec.models.losses.task_loss` for one loss."""
        weights = rest[0] if self.weighted else None
        sessions = rest[-1] if self.session_names else None
        out = {}
        for i, (task, task_logits) in enumerate(zip(self.tasks, self.task_logits(logits))):
            task_labels, task_weights = (labels, weights) if not self.multi_task else \
                (labels[:, i], None if weights is None else weights[:, i])
            for spec, name in zip(task.losses, task.loss_names):
                task_sessions = None if spec.name != "jrc_loss" else \
                    sessions[:, self.session_names.index(spec.session_name)]
                loss = task_loss(spec, task_logits, task_labels, task_weights, task_sessions)
                out[name] = task.weight * loss if self.multi_task else loss
        return out

    @staticmethod
    def _target(batch, name: str, what: str) -> torch.Tensor:
        if name not in batch.labels:
            raise ModelError(f"batch has no {what} {name!r} (labels: {list(batch.labels)})")
        return batch.labels[name].float()

    def loss(self, predictions: dict[str, torch.Tensor], batch,
             targets: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """Per-loss scalar tensors (float32), averaged over the batch (weighted by the
        row weights where the tasks have them, see ``sample_weights``); ``targets``: the
        batch's ``targets(batch)`` where the caller has them already."""
        parts = [predictions[task.logits] for task in self.tasks]
        logits = torch.cat([p if p.dim() == 2 else p.unsqueeze(-1) for p in parts], dim=-1) \
            if self.multi_task else parts[0]
        return self.losses_from_logits(logits, *(targets or self.targets(batch)))


def first_ids(bags) -> torch.Tensor:
    """Each row's first id of a jagged feature (B,) int64, 0 for a row without one; no
    host reads."""
    lengths = bags.lengths
    if bags.values.numel() == 0:
        return torch.zeros_like(lengths, dtype=torch.int64)
    starts = (torch.cumsum(lengths, 0) - lengths).clamp(max=bags.values.numel() - 1)
    return torch.where(lengths > 0, bags.values[starts], torch.zeros_like(lengths))

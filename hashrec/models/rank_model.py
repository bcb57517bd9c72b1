"""Shared plumbing of ranking models: embeddings, feature groups, loss.

A ranking model owns an ``EmbeddingCollection`` (dense and dynamic tables with
a fused sparse optimizer) and a dense network. Embedding lookups always run in
float32, outside any autocast region the trainer opens; only the dense network
runs in reduced precision under mixed precision training.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import GroupSpec, build_group_spec, feature_infos
from hashrec.models.tasks import MULTI_TASK_MODELS, model_tasks
from hashrec.modules import MLP, MLPOptions

logger = logging.getLogger(__name__)


def mlp_options(mlp_config, where: str) -> MLPOptions:
    """Convert an ``MLP`` config message into MLPOptions.

    Raises:
        ModelError: the options are invalid; the message names ``where``.
    """
    try:
        return MLPOptions(
            hidden_units=tuple(mlp_config.hidden_units),
            dropout_ratio=tuple(mlp_config.dropout_ratio),
            activation=mlp_config.activation,
            use_bn=mlp_config.use_bn,
            use_ln=mlp_config.use_ln,
            bias=mlp_config.bias,
        )
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err


def optional_mlp(config, field: str, width: int, where: str) -> tuple[MLP | None, int]:
    """The MLP of the optional ``MLP`` field ``config.<field>`` over ``width`` inputs:
    (the MLP, its output width), or (None, ``width``) where the field is unset."""
    if not config.HasField(field):
        return None, width
    mlp = MLP(width, mlp_options(getattr(config, field), where))
    return mlp, mlp.output_dim()


class RankModel(nn.Module):
    """Base of ranking models (one logit per row and task, see ``hashrec.models.tasks``).

    Args:
        model_config: the pipeline's ``ModelConfig`` message.
        feature_set: the ``FeatureSet`` built from the pipeline config (the features the
            feature groups name; ``left_out`` lists the others, logged once here).
        sparse_optimizer: optimizer spec of the embedding tables (hashrec.table).
        device: where the embedding tables live (the trainer moves the dense part).
        embedding: a prebuilt embedding module (``EmbeddingCollection`` interface);
            None builds an ``EmbeddingCollection`` from ``feature_set``.

    Subclasses implement ``dense_inputs`` and ``dense_from_inputs``: logits (B,), or
    (B, tasks) of a multi-task model.
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__()
        if model_config.num_class != 1:
            raise ModelError(
                f"model_config.num_class={model_config.num_class}; only 1 (binary ranking) "
                f"is supported")
        # What each logit predicts (hashrec.models.tasks): one task, on label_fields[0],
        # for a single-task model.
        self.tasks = model_tasks(model_config, feature_set.label_fields,
                                 getattr(feature_set, "sample_weight_fields", ()))
        self.multi_task = model_config.WhichOneof("model") in MULTI_TASK_MODELS
        self.label_name = self.tasks[0].label_name
        # Whether the losses are weighted means over the rows (``sample_weights``).
        self.weighted = any(task.row_weighted for task in self.tasks)
        # The keys of the losses, in task order.
        self.losses = tuple(task.loss_name for task in self.tasks)
        # A single-task model's l2_loss makes it a regression model, whose prediction
        # ``y`` is the logit itself; binary_cross_entropy: a classifier, whose prediction
        # ``probs`` is its sigmoid.
        self.regression = self.tasks[0].regression
        self.prediction = self.tasks[0].prediction
        self.groups = self._build_groups(model_config, feature_set)
        if embedding is None:
            from hashrec.embedding import EmbeddingCollection

            embedding = EmbeddingCollection(
                feature_set.embedding_tables(), feature_set.embedding_features(),
                sparse_optimizer, device)
        self.embedding = embedding

    @staticmethod
    def _build_groups(model_config, feature_set) -> dict[str, GroupSpec]:
        infos = feature_infos(feature_set)
        groups: dict[str, GroupSpec] = {}
        for group_config in model_config.feature_groups:
            if group_config.group_name in groups:
                raise ModelError(f"feature group {group_config.group_name!r} is defined twice")
            groups[group_config.group_name] = build_group_spec(group_config, infos,
                                                               feature_set.left_out)
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

    def embed(self, batch, embedding_hook=None):
        """Embedding lookups in float32 (autocast is switched off here), then
        ``embedding_hook`` (see :meth:`forward`) when given."""
        device_type = batch.sparse.device.type
        with torch.autocast(device_type=device_type, enabled=False):
            embedded = self.embedding(batch.sparse)
        return embedded if embedding_hook is None else embedding_hook(embedded)

    def dense_forward(self, embedded, batch) -> torch.Tensor:
        """The dense network: embedding output -> logits (B,)."""
        return self.dense_from_inputs(*self.dense_inputs(embedded, batch))

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """The dense network's inputs as a flat tuple of tensors (group inputs built from
        the embedding output and the batch): what a CUDA graph of the dense network
        takes (``hashrec.train.graphs``)."""
        raise NotImplementedError

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> logits (B,) or (B, tasks); only tensor ops of fixed shapes, no
        host reads."""
        raise NotImplementedError

    def dense_modules(self) -> list[nn.Module]:
        """The submodules holding the dense network's parameters (all but the embedding)."""
        return [m for name, m in self.named_children() if name != "embedding"]

    def forward(self, batch, embedding_hook=None) -> dict[str, torch.Tensor]:
        """Batch -> {"logits": (B,) float32, "probs": (B,) float32}; a regression model
        (l2_loss) gives {"logits", "y"}, ``y`` the logits themselves. A multi-task model
        gives each task's ``logits_<tower_name>`` and ``probs_<tower_name>`` (or
        ``y_<tower_name>``).

        Args:
            batch: a ``Batch`` on the model's device.
            embedding_hook: optional map applied to the embedding output before the
                dense network (the trainer's FP16 gradient unscaling).
        """
        logits = self.dense_forward(self.embed(batch, embedding_hook), batch).float()
        return self.predictions(logits)

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits (B,), or (B, tasks) of a multi-task model -> each task's logits and
        prediction, (B,) each."""
        out = {}
        for i, task in enumerate(self.tasks):
            task_logits = logits[:, i] if self.multi_task else logits
            out[task.logits] = task_logits
            out[task.prediction] = task_logits if task.regression else \
                torch.sigmoid(task_logits)
        return out

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

    def targets(self, batch) -> tuple[torch.Tensor, ...]:
        """What the loss reads besides the logits: (labels,) or (labels, weights), both
        (B,) or (B, tasks)."""
        weights = self.sample_weights(batch)
        return (self.labels(batch),) if weights is None else (self.labels(batch), weights)

    @staticmethod
    def _target(batch, name: str, what: str) -> torch.Tensor:
        if name not in batch.labels:
            raise ModelError(f"batch has no {what} {name!r} (labels: {list(batch.labels)})")
        return batch.labels[name].float()

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Per-loss scalar tensors (float32) of logits and labels (B,), or (B, tasks) of
        a multi-task model, whose task losses are each multiplied by the task's weight;
        ``weights`` as ``labels`` (see ``sample_weights``). See :func:`task_loss` for one
        loss."""
        out = {}
        for i, task in enumerate(self.tasks):
            if not self.multi_task:
                out[task.loss_name] = task_loss(task.loss, logits, labels, weights)
                continue
            loss = task_loss(task.loss, logits[:, i], labels[:, i],
                             None if weights is None else weights[:, i])
            out[task.loss_name] = task.weight * loss
        return out

    def loss(self, predictions: dict[str, torch.Tensor], batch,
             targets: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """Per-loss scalar tensors (float32), averaged over the batch (weighted by the
        row weights where the tasks have them, see ``sample_weights``); ``targets``: the
        batch's ``targets(batch)`` where the caller has them already."""
        logits = torch.stack([predictions[task.logits] for task in self.tasks], dim=-1) \
            if self.multi_task else predictions["logits"]
        return self.losses_from_logits(logits, *(targets or self.targets(batch)))


def task_loss(name: str, logits: torch.Tensor, labels: torch.Tensor,
              weights: torch.Tensor | None = None) -> torch.Tensor:
    """One loss (float32 scalar) of logits and labels (B,): the mean over the batch, or
    with ``weights`` (B,) the weighted mean sum(w * loss) / sum(w) (0 when every weight
    is 0). binary_cross_entropy on the logits; l2_loss: (logit - label) ** 2."""
    reduction = "mean" if weights is None else "none"
    loss = nn.functional.mse_loss(logits, labels, reduction=reduction) \
        if name == "l2_loss" else \
        nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction=reduction)
    return loss if weights is None else (loss * weights).sum() / \
        weights.sum().clamp_min(torch.finfo(torch.float32).tiny)

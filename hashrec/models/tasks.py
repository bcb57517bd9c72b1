"""The tasks of a ranking model: what each of its logits predicts, from which label.

A single-task model has one task without a name: it trains on ``label_fields[0]``
with ``model_config.losses`` and reports ``model_config.metrics``, its outputs are
``logits`` and ``probs`` (``y`` with l2_loss). A multi-task model (SimpleMultiTask, MMoE,
DBMTL, DC2VR, PLE, PEPNet) has one task per ``task_towers`` entry, each with its own label,
losses, loss weight and metrics; the task's outputs, loss and metrics carry the suffix
``_<tower_name>``
(``probs_ctr``, ``logits_ctr``, ``binary_cross_entropy_ctr``, ``auc_ctr``), as in
TorchEasyRec.

A task has ``num_class`` logits (``model_config.num_class``, a task tower's
``num_class``): 1 with binary_cross_entropy, binary_focal_loss (predictions ``logits``
and ``probs`` = sigmoid, (B,)) or l2_loss (``y``); C > 1 with softmax_cross_entropy,
2 with jrc_loss (``logits`` (B, C) and ``probs`` = their softmax (B, C), and with two
classes ``probs1`` = probs[:, 1], (B,)), as in TorchEasyRec; the label is then the class
id 0 .. C-1. A task of several losses (``losses`` listing more than one) trains on their
sum, each under its key (``binary_cross_entropy_ctr``, ``binary_focal_loss_ctr``), as in
TorchEasyRec; they must make one prediction (:func:`losses_problem`).

PEPNet's towers per domain (``domain_input_name``, ``task_domain_num`` K) give each task K
towers, whose outputs carry the suffix ``_<tower_name>_<k>`` (``probs_ctr_0``), as in
TorchEasyRec: :func:`task_domains` reads the two fields, :func:`output_tasks` lists the
outputs' tasks. The task itself (its loss and metrics, ``probs_ctr``) reads, on each row,
the tower of the row's domain.

A multi-task model's losses are summed, each times its task's ``weight``; with
``model_config.use_pareto_loss_weight`` the trainer weighs them (each already times its
task's weight) by Pareto-efficient weights instead, solved every step, each at least its
tower's ``pareto_min_loss_weight`` (:func:`pareto_min_weights`, ``hashrec.train.pareto``),
as TorchEasyRec does.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

from hashrec.config.floats import proto_float
from hashrec.config.match_params import match_params
from hashrec.models.errors import ModelError
from hashrec.models.losses import BINARY_LOSSES, CLASS_LOSSES, LOSSES, LossSpec

logger = logging.getLogger(__name__)

SUPPORTED_LOSSES = LOSSES
# The model_config oneof names of the models whose config lists task_towers.
MULTI_TASK_MODELS = ("simple_multi_task", "mmoe", "dbmtl", "ple", "pepnet",
                     "multi_task_backbone", "dc2vr")
# The model_config oneof names of the models whose tasks are fusion_mtl_tower.task_configs,
# each predicting every candidate of a row (dlrm_hstu).
FUSION_MODELS = ("dlrm_hstu",)
# The model_config oneof names of the match (retrieval) models: one task whose output is
# the similarity of each row's user to its positive item and the negatives.
MATCH_MODELS = ("dssm", "dssm_v2", "mind", "dat", "match_backbone", "hstu_match")
# Where a match task's positive item sits in a row of its similarities: column i of row i
# (in-batch negatives: every item of the batch is a column), or column 0 (the row's own
# item, then the sampled negatives).
MATCH_DIAGONAL = "diagonal"
MATCH_FIRST = "first"
# The columns a match model's export predicts for each row: the row's user and item
# embedded by their towers, and their similarity (over the temperature).
MATCH_OUTPUTS = ("user_tower_emb", "item_tower_emb", "similarity")


@dataclass(frozen=True)
class Task:
    """One task of a model: its logits, and how they are trained and evaluated."""

    # The tower name; "" for the one task of a single-task model.
    name: str = ""
    # The label column the loss and the metrics read.
    label_name: str = ""
    # The (first) loss: binary_cross_entropy or binary_focal_loss (prediction probs, the
    # logit's sigmoid), softmax_cross_entropy or jrc_loss (probs, the logits' softmax) or
    # l2_loss (prediction y, the logit itself), with its options.
    loss: LossSpec = field(default_factory=LossSpec)
    # The task loss's weight in the total loss.
    weight: float = 1.0
    # The task's MetricConfig messages (empty: the default metric).
    metric_configs: tuple = field(default=(), compare=False)
    # Where the task is configured, for messages.
    where: str = "model_config"
    # The column of the task's row loss weights; "" weighs every row 1.
    sample_weight_name: str = ""
    # The label column whose values > 0 mark the task's space; "" puts every row in it.
    task_space_label: str = ""
    # The row weight's factor in the task's space.
    in_task_space_weight: float = 1.0
    # The row weight's factor out of the task's space.
    out_task_space_weight: float = 1.0
    # The task's logits a row: 1, or the classes of softmax_cross_entropy (2 or more) and
    # jrc_loss (2).
    num_class: int = 1
    # The losses the task trains on besides ``loss``, summed with it (each of another kind,
    # of the same prediction: binary_focal_loss beside binary_cross_entropy, jrc_loss beside
    # softmax_cross_entropy).
    more_losses: tuple[LossSpec, ...] = ()
    # The task's TrainMetricConfig messages: metrics of the training batches
    # (``hashrec.train.train_metrics``; empty: none).
    train_metric_configs: tuple = field(default=(), compare=False)
    # A match model's task: where each row's positive sits among its similarities
    # (MATCH_DIAGONAL or MATCH_FIRST); "" for a ranking task.
    match: str = ""
    # The least Pareto loss weight of each of the task's losses (the tower's
    # ``pareto_min_loss_weight``; read with ``model_config.use_pareto_loss_weight``).
    pareto_min_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.match:
            if self.match not in (MATCH_DIAGONAL, MATCH_FIRST):
                raise ValueError(f"Task.match={self.match!r}; allowed: {MATCH_DIAGONAL}, "
                                 f"{MATCH_FIRST} or '' (a ranking task)")
            return
        for name in ("in_task_space_weight", "out_task_space_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Task.{name}={value}; allowed: a finite number >= 0")
        if not (math.isfinite(self.pareto_min_weight) and 0 <= self.pareto_min_weight < 1):
            raise ValueError(f"Task.pareto_min_weight={self.pareto_min_weight}; allowed: a "
                             f"number in [0, 1)")
        problem = losses_problem(tuple(spec.name for spec in self.losses))
        if problem:
            raise ValueError(f"Task.more_losses: {problem}")
        for spec in self.losses:
            if not num_class_fits(spec.name, self.num_class):
                raise ValueError(f"Task.num_class={self.num_class} does not fit "
                                 f"{spec.name} (jrc_loss: 2; softmax_cross_entropy: 2 or "
                                 f"more; the others: 1)")

    @property
    def losses(self) -> tuple[LossSpec, ...]:
        """Every loss the task trains on, ``loss`` first."""
        return (self.loss, *self.more_losses)

    @property
    def row_weighted(self) -> bool:
        """Whether the task's loss is a weighted mean over the rows (a sample weight
        column or a task space), not a plain mean."""
        return bool(self.sample_weight_name or self.task_space_label)

    @property
    def suffix(self) -> str:
        """``_<name>``, or "" for a single-task model's task."""
        return f"_{self.name}" if self.name else ""

    @property
    def regression(self) -> bool:
        return self.loss.name == "l2_loss"

    @property
    def prediction(self) -> str:
        """The prediction's output name: ``probs<suffix>`` or ``y<suffix>``; a match
        task's ``similarity``."""
        if self.match:
            return "similarity"
        return ("y" if self.regression else "probs") + self.suffix

    @property
    def positive_probs(self) -> str:
        """The output holding each row's probability of the positive class (what auc and
        grouped_auc read): ``probs1<suffix>`` with two classes, else the prediction."""
        return "probs1" + self.suffix if self.num_class == 2 else self.prediction

    @property
    def logits(self) -> str:
        return "similarity" if self.match else "logits" + self.suffix

    @property
    def outputs(self) -> tuple[str, ...]:
        """The task's output names: its prediction, ``probs1<suffix>`` with two classes,
        then its logits."""
        if self.match:
            return (self.prediction,)
        second = (self.positive_probs,) if self.num_class == 2 else ()
        return (self.prediction, *second, self.logits)

    @property
    def loss_names(self) -> tuple[str, ...]:
        """The keys of the task's losses among the model's losses, in ``losses`` order."""
        return tuple(spec.name + self.suffix for spec in self.losses)

    def loss_of(self, name: str) -> LossSpec | None:
        """The task's loss of kind ``name``, None where it has none."""
        return next((spec for spec in self.losses if spec.name == name), None)


def num_class_fits(loss: str, num_class: int) -> bool:
    """Whether a task of ``num_class`` logits can train on ``loss``: 2 for jrc_loss, 2 or
    more for softmax_cross_entropy, 1 for the others."""
    if loss == "jrc_loss":
        return num_class == 2
    if loss == "softmax_cross_entropy":
        return num_class >= 2
    return num_class == 1


# The losses that may train one task together: those of one prediction.
_LOSS_FAMILIES = (BINARY_LOSSES, CLASS_LOSSES, ("l2_loss",))


def losses_problem(names: tuple[str, ...]) -> str:
    """Why the losses ``names`` cannot train one task together ("" where they can): a
    kind twice (its key would name two losses), or kinds of different predictions."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return (f"{', '.join(twice)} listed twice; a task's losses are reported by kind: "
                f"list each kind once")
    if not any(set(names) <= set(family) for family in _LOSS_FAMILIES):
        return (f"{' and '.join(names)} together; the losses of a task must make one "
                f"prediction (binary_cross_entropy and binary_focal_loss: probs, the "
                f"sigmoid; softmax_cross_entropy and jrc_loss: probs, the softmax; l2_loss: "
                f"y): keep those of one, or give the other its own task tower")
    return ""


def loss_specs(loss_configs, where: str, num_class: int = 1) -> tuple[LossSpec, ...]:
    """The losses of ``loss_configs`` with their options, in config order, for a task of
    ``num_class`` logits (binary_cross_entropy when there is none). The task trains on
    their sum, as TorchEasyRec's; the first decides its predictions.

    Raises:
        ModelError: no loss kind set, a kind twice, kinds of different predictions
            (:func:`losses_problem`), a num_class a loss does not take, or an option out
            of its range.
    """
    names = tuple(loss.WhichOneof("loss") for loss in loss_configs)
    for name in names:
        if name is None:
            raise ModelError(f"{where}.losses: a loss config sets no loss; set one of "
                             f"{', '.join(SUPPORTED_LOSSES)}")
        if name not in SUPPORTED_LOSSES:
            raise ModelError(f"{where}.losses: {name!r} is not supported; allowed: "
                             f"{', '.join(SUPPORTED_LOSSES)}")
    problem = losses_problem(names)
    if problem:
        raise ModelError(f"{where}.losses: {problem}")
    specs = tuple(_spec_of(config, name, where) for config, name in zip(loss_configs, names))
    specs = specs or (LossSpec(),)
    for spec in specs:
        _check_num_class(spec.name, num_class, where)
    return specs


def _spec_of(config, name: str, where: str) -> LossSpec:
    options = getattr(config, name)
    kwargs = {field_name: getattr(options, field_name)
              for field_name in ("gamma", "alpha", "label_smoothing", "session_name")
              if field_name in options.DESCRIPTOR.fields_by_name}
    # float fields hold float32: take the value the config wrote (0.1, not 0.100000001)
    kwargs = {k: proto_float(v) if isinstance(v, float) else v for k, v in kwargs.items()}
    try:
        return LossSpec(name, **kwargs)
    except ValueError as err:
        raise ModelError(f"{where}.losses.{name}: "
                         f"{str(err).removeprefix('LossSpec.')}") from None


def _check_num_class(loss: str, num_class: int, where: str) -> None:
    if num_class_fits(loss, num_class):
        return
    if loss in CLASS_LOSSES:
        need = "2 (two classes)" if loss == "jrc_loss" else "2 or more (the classes)"
        raise ModelError(f"{where}.num_class={num_class} with {loss}; {loss} needs "
                         f"num_class {need}")
    kind = "one logit (a label in [0, 1])" if loss in BINARY_LOSSES else "one value a row"
    hint = "; for several classes use softmax_cross_entropy" if loss in BINARY_LOSSES else ""
    raise ModelError(f"{where}.num_class={num_class} with {loss}, which trains {kind}: set "
                     f"num_class 1{hint}")


def model_tasks(model_config, label_fields, sample_weight_fields=()) -> tuple[Task, ...]:
    """The tasks of the model ``model_config`` sets, over the label columns
    ``label_fields`` (``data_config.label_fields``) and the sample weight columns
    ``sample_weight_fields`` (``data_config.sample_weight_fields``: the first weighs a
    single-task model's rows; a task tower is weighted by its own ``sample_weight_name``
    alone, as in TorchEasyRec).

    Raises:
        ModelError: no label; a loss that does not fit its num_class or has an option
            out of range (:func:`loss_specs`); a multi-task model without task towers,
            with two towers of one name, with a label that is not a label field, with
            model-level losses, metrics, train_metrics or num_class (they belong to the
            task towers),
            or with task loss weighting that names unknown columns or a negative factor;
            ``use_pareto_loss_weight`` on a single-task model, or least Pareto weights
            (``pareto_min_loss_weight``) out of [0, 1) or summing to 1 or more.
    """
    labels = list(label_fields)
    kind = model_config.WhichOneof("model")
    if not labels and kind != "hstu_match":  # its loss reads no label
        raise ModelError("data_config.label_fields is empty; a ranking model needs a label")
    weights = list(sample_weight_fields)
    default_weight = weights[0] if weights else ""
    if kind not in MULTI_TASK_MODELS and model_config.use_pareto_loss_weight:
        raise ModelError(f"model_config.use_pareto_loss_weight: true is set on the single-task "
                         f"model {kind}; Pareto loss weights balance the losses of a "
                         f"multi-task model's task_towers ({', '.join(MULTI_TASK_MODELS)}): "
                         f"remove it")
    if kind in MATCH_MODELS:
        return (_match_task(model_config, kind, labels[0] if labels else "", default_weight),)
    if kind in FUSION_MODELS:
        return _fusion_tasks(model_config, kind, labels)
    if kind not in MULTI_TASK_MODELS:
        if len(labels) > 1:
            logger.warning("data_config.label_fields %s: the single-task model %s trains on "
                           "the first, %r; the others are read from the input but not used "
                           "(a multi-task model, simple_multi_task, mmoe, dbmtl, dc2vr, ple or "
                           "pepnet, gives each its task)",
                           labels, kind, labels[0])
        num_class = int(model_config.num_class)
        first, *more = loss_specs(model_config.losses, "model_config", num_class)
        # RocketLaunching's predictions, losses and metrics are its light network's, named
        # so (probs_light, auc_light), as in TorchEasyRec.
        name = "light" if kind == "rocket_launching" else ""
        return (Task(name, labels[0], first, 1.0, tuple(model_config.metrics),
                     sample_weight_name=default_weight, num_class=num_class,
                     more_losses=tuple(more),
                     train_metric_configs=tuple(model_config.train_metrics)),)
    if model_config.num_class != 1:
        raise ModelError(f"model_config.num_class={model_config.num_class} is set on the "
                         f"multi-task model {kind}; set num_class on each of "
                         f"{kind}.task_towers instead")
    for what in ("losses", "metrics", "train_metrics"):
        if len(getattr(model_config, what)):
            raise ModelError(f"model_config.{what} is set on the multi-task model {kind}; "
                             f"set {what} on each of {kind}.task_towers instead")
    towers = getattr(model_config, kind).task_towers
    if not towers:
        raise ModelError(f"{kind} has no task_towers; add one per task (tower_name, "
                         f"label_name)")
    tasks: list[Task] = []
    for i, tower in enumerate(towers):
        where = f"{kind}.task_towers[{tower.tower_name!r}]"
        if not tower.tower_name:
            raise ModelError(f"{kind}.task_towers: a tower has an empty tower_name")
        if any(task.name == tower.tower_name for task in tasks):
            raise ModelError(f"{where} is defined twice; tower names must be unique")
        tasks.append(_tower_task(tower, i, where, labels, weights))
    if model_config.use_pareto_loss_weight:
        _check_pareto_min_weights(kind, tasks)
    return tuple(tasks)


def _check_pareto_min_weights(kind: str, tasks: list[Task]) -> None:
    """The least Pareto weights of every loss (a tower's once per loss, as TorchEasyRec
    counts them) must sum to below 1, leaving the solved weights room."""
    total = sum(task.pareto_min_weight * len(task.losses) for task in tasks)
    if total >= 1:
        parts = ", ".join(f"{task.name} {task.pareto_min_weight:g} x {len(task.losses)}"
                          for task in tasks if task.pareto_min_weight)
        raise ModelError(f"{kind}.task_towers: pareto_min_loss_weight sums to {total:g} over "
                         f"the towers' losses ({parts}); the least weights of "
                         f"model_config.use_pareto_loss_weight must sum to below 1: lower them")


def pareto_min_weights(model_config, tasks) -> tuple[float, ...] | None:
    """The least Pareto loss weight of each loss of ``tasks`` (``RankModel.losses``
    order: a tower's ``pareto_min_loss_weight`` for each of its losses), or None where
    ``model_config.use_pareto_loss_weight`` is off (a tower's pareto_min_loss_weight is
    then warned of, unused, as TorchEasyRec ignores it)."""
    if not model_config.use_pareto_loss_weight:
        unused = [task.where for task in tasks if task.pareto_min_weight]
        if unused:
            logger.warning("%s: pareto_min_loss_weight is not used: "
                           "model_config.use_pareto_loss_weight is false (the losses are "
                           "summed, each times its tower's weight)", ", ".join(unused))
        return None
    return tuple(task.pareto_min_weight for task in tasks for _ in task.losses)


def _match_task(model_config, kind: str, label: str, weight: str) -> Task:
    """The one task of the match model ``kind``: softmax_cross_entropy of each row's
    similarities, its positive at column 0 or, with in_batch_negative, at column i. The
    label column is read (as TorchEasyRec reads it) but does not enter the loss."""
    names = [loss.WhichOneof("loss") for loss in model_config.losses]
    if names not in ([], ["softmax_cross_entropy"]):
        raise ModelError(f"model_config.losses lists {', '.join(map(str, names))}; {kind} "
                         f"trains on one softmax_cross_entropy")
    smoothing = proto_float(model_config.losses[0].softmax_cross_entropy.label_smoothing) \
        if names else 0.0
    spec = LossSpec("softmax_cross_entropy", label_smoothing=smoothing)
    in_batch = match_params(model_config).in_batch_negative
    return Task("", label, spec, 1.0, tuple(model_config.metrics),
                sample_weight_name=weight,
                match=MATCH_DIAGONAL if in_batch else MATCH_FIRST)


def _fusion_tasks(model_config, kind: str, labels: list[str]) -> tuple[Task, ...]:
    """The tasks of ``kind``'s ``fusion_mtl_tower.task_configs``, one a config, each with
    its label column, losses, metrics, num_class and weight (TorchEasyRec's
    FusionSubTaskConfig; its task_bitmask is the model's).

    Raises:
        ModelError: model-level losses, metrics, train_metrics or num_class; no task; a
            task without a name, of a name twice, with a label that is not a label field,
            a negative weight, or a loss that does not fit its num_class.
    """
    for what in ("losses", "metrics", "train_metrics"):
        if len(getattr(model_config, what)):
            raise ModelError(f"model_config.{what} is set on {kind}; set {what} on each of "
                             f"{kind}.fusion_mtl_tower.task_configs instead")
    if model_config.num_class != 1:
        raise ModelError(f"model_config.num_class={model_config.num_class} is set on {kind}; "
                         f"set num_class on each of {kind}.fusion_mtl_tower.task_configs")
    configs = getattr(model_config, kind).fusion_mtl_tower.task_configs
    if not configs:
        raise ModelError(f"{kind}.fusion_mtl_tower has no task_configs; add one per task "
                         f"(task_name, label_name)")
    tasks: list[Task] = []
    for config in configs:
        where = f"{kind}.fusion_mtl_tower.task_configs[{config.task_name!r}]"
        if not config.task_name:
            raise ModelError(f"{kind}.fusion_mtl_tower.task_configs: a task has an empty "
                             f"task_name")
        if any(task.name == config.task_name for task in tasks):
            raise ModelError(f"{where} is defined twice; task names must be unique")
        if config.label_name not in labels:
            raise ModelError(f"{where}.label_name {config.label_name!r} is not one of "
                             f"data_config.label_fields ({', '.join(labels)}); add it there")
        weight = proto_float(float(config.weight))
        if not (math.isfinite(weight) and weight >= 0):
            raise ModelError(f"{where}.weight={weight}; the task loss's weight must be a "
                             f"finite number >= 0")
        first, *more = loss_specs(config.losses, where, int(config.num_class))
        tasks.append(Task(config.task_name, config.label_name, first, weight,
                          tuple(config.metrics), where, num_class=int(config.num_class),
                          more_losses=tuple(more)))
    return tuple(tasks)


def _tower_task(tower, i: int, where: str, labels: list[str], weights: list[str]) -> Task:
    """The task of task tower ``tower``, the ``i``-th (configured at ``where``), over the
    label columns ``labels`` and the sample weight columns ``weights``."""
    # A DBMTL or DC2VR tower without label_name reads the label field of its position.
    label = tower.label_name if tower.HasField("label_name") or i >= len(labels) \
        else labels[i]
    if not label:
        raise ModelError(f"{where} has no label_name, and data_config.label_fields has no "
                         f"field at its position {i} (it lists {', '.join(labels)}): set "
                         f"label_name")
    if label not in labels:
        raise ModelError(f"{where}.label_name {label!r} is not one of "
                         f"data_config.label_fields ({', '.join(labels)}); add it there")
    if not (math.isfinite(tower.weight) and tower.weight >= 0):
        raise ModelError(f"{where}.weight={tower.weight}; the task loss's weight must be "
                         f"a finite number >= 0")
    least = proto_float(float(tower.pareto_min_loss_weight))
    if not (math.isfinite(least) and 0 <= least < 1):
        raise ModelError(f"{where}.pareto_min_loss_weight={least}; the least Pareto loss "
                         f"weight must be a number in [0, 1)")
    first, *more = loss_specs(tower.losses, where, int(tower.num_class))
    return Task(tower.tower_name, label, first, float(tower.weight), tuple(tower.metrics),
                where, **_row_weighting(tower, where, labels, weights),
                num_class=int(tower.num_class), more_losses=tuple(more),
                train_metric_configs=tuple(tower.train_metrics), pareto_min_weight=least)


def _row_weighting(tower, where: str, labels: list[str], weights: list[str]) -> dict:
    """The Task fields of a tower's row loss weights, checked against the label columns
    ``labels`` and the sample weight columns ``weights`` (a tower naming no column has
    none: its rows weigh 1, times its task-space factor)."""
    name = tower.sample_weight_name
    if name and name not in weights:
        raise ModelError(f"{where}.sample_weight_name {name!r} is not one of "
                         f"data_config.sample_weight_fields ({', '.join(weights) or 'none'}); "
                         f"add it there")
    space = tower.task_space_indicator_label
    if space and space not in labels:
        raise ModelError(f"{where}.task_space_indicator_label {space!r} is not one of "
                         f"data_config.label_fields ({', '.join(labels)}); add it there")
    factors = {}
    for field_name in ("in_task_space_weight", "out_task_space_weight"):
        value = proto_float(float(getattr(tower, field_name)))
        if not (math.isfinite(value) and value >= 0):
            raise ModelError(f"{where}.{field_name}={value}; a row loss weight's factor "
                             f"must be a finite number >= 0")
        factors[field_name] = value
    return {"sample_weight_name": name,
            "task_space_label": space, **factors}


def task_domains(model_config, label_fields=None) -> tuple[str, int]:
    """PEPNet's towers per domain: (``domain_input_name``, the label column holding each
    row's domain index, ``task_domain_num`` K, the domains); ("", 0) for a model without
    (every model but a PEPNet that sets ``domain_input_name``). As in TorchEasyRec,
    ``domain_input_name`` alone makes the towers per domain (K 1 gives each task one,
    output ``probs_<tower_name>_0``).

    Args:
        model_config: the pipeline's ``ModelConfig``.
        label_fields: ``data_config.label_fields``, where the domain column must be; None
            leaves that unchecked.

    Raises:
        ModelError: ``task_domain_num`` 0, or other than 1 without ``domain_input_name``
            (TorchEasyRec would train one tower a task, without a word); an empty
            ``domain_input_name``, or one that is not a label field.
    """
    if model_config.WhichOneof("model") != "pepnet":
        return "", 0
    config = model_config.pepnet
    count = int(config.task_domain_num)
    if count < 1:
        raise ModelError(f"pepnet.task_domain_num={count}; allowed: 1 or more (the domains, "
                         f"each task has a tower per domain)")
    if not config.HasField("domain_input_name"):
        if count != 1:
            raise ModelError(f"pepnet.task_domain_num={count} without domain_input_name: the "
                             f"towers per domain need each row's domain; set "
                             f"domain_input_name to the label field holding it (an id in "
                             f"[0, {count})), or remove task_domain_num")
        return "", 0
    name = config.domain_input_name
    if not name:
        raise ModelError("pepnet.domain_input_name is empty; name the label field holding "
                         "each row's domain (an id in [0, task_domain_num))")
    if label_fields is not None and name not in label_fields:
        raise ModelError(f"pepnet.domain_input_name {name!r} is not one of "
                         f"data_config.label_fields ({', '.join(label_fields) or 'none'}); add "
                         f"it there, as TorchEasyRec reads the row's domain as a label")
    return name, count


def output_tasks(tasks, domains: int) -> tuple[Task, ...]:
    """The tasks of a model's outputs, in the order of its logits: ``tasks``, or with
    ``domains`` K > 0 (PEPNet's towers per domain, :func:`task_domains`) each task K
    times, named ``<tower_name>_<k>`` for k = 0 .. K-1."""
    if not domains:
        return tuple(tasks)
    return tuple(dataclasses.replace(task, name=f"{task.name}_{k}")
                 for task in tasks for k in range(domains))


def prediction_columns(tasks) -> tuple[str, ...]:
    """The output columns of a model with ``tasks``: every prediction (and ``probs1`` of a
    two-class task after its ``probs``), then every logit; a match model's exported form
    gives ``MATCH_OUTPUTS``."""
    if tasks and tasks[0].match:
        return MATCH_OUTPUTS
    return tuple(name for t in tasks for name in t.outputs[:-1]) + \
        tuple(t.logits for t in tasks)

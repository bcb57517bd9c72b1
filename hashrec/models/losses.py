"""The losses a task trains on, row by row, and their mean over a batch.

Shapes: logits (B,) for a task of one logit, (B, C) for a task of C classes; labels
(B,) float32 (in [0, 1], a value, or a class id 0 .. C-1); row weights (B,); session ids (B,)
int64. With p = sigmoid(logit) and y the label:

* ``binary_cross_entropy``: -[y log p + (1 - y) log(1 - p)].
* ``binary_focal_loss``: binary_cross_entropy times the factor
  ``alpha * y * (1 - p)^gamma + (1 - alpha) * (1 - y) * p^gamma``, a constant to the
  gradient (as in TorchEasyRec, whose factor is detached): rows the model already gets
  right weigh less, and ``alpha`` weighs the positives against the negatives.
* ``softmax_cross_entropy``: -sum_c q_c log softmax(z)_c, the target q the one-hot label
  smoothed by ``label_smoothing`` e: q = (1 - e) one_hot(y) + e / C (torch's
  ``cross_entropy``).
* ``jrc_loss`` (two classes; https://arxiv.org/abs/2208.06164): ``alpha`` times the
  softmax cross entropy of the row (calibration) plus ``1 - alpha`` times its session
  term (ranking). A positive row competes, on the positive logit z[:, 1], with the
  negatives of its session: its term is -log(exp(z_i1) / (exp(z_i1) + sum_j exp(z_j1))),
  j over those negatives; a negative row competes likewise, on z[:, 0], with its
  session's positives. A row with no competitor in the batch has a term of 0. Sessions
  are the rows sharing a session id.
* ``l2_loss``: (logit - y)^2.

A batch's loss is the mean of its rows' losses, or with row weights w the weighted mean
sum(w * loss) / sum(w) (0 when every weight is 0). Every function here has fixed shapes
and reads nothing back to the host, so the trainer can capture it in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

LOSSES = ("binary_cross_entropy", "binary_focal_loss", "softmax_cross_entropy", "jrc_loss",
          "l2_loss")
# The losses of a task with one logit whose prediction is its sigmoid.
BINARY_LOSSES = ("binary_cross_entropy", "binary_focal_loss")
# The losses of a task with num_class logits whose prediction is their softmax.
CLASS_LOSSES = ("softmax_cross_entropy", "jrc_loss")

# The logit given to a row that is no competitor in a session's log-sum-exp: beside any
# real logit its exp is 0, and a session without competitors gets a finite value whose
# term softplus(-1e9 - z) is 0 with a zero gradient (no inf, so no NaN gradient).
_NOT_A_COMPETITOR = -1e9


@dataclass(frozen=True)
class LossSpec:
    """A task's loss and its options (the ``LossConfig`` message's)."""

    # One of LOSSES.
    name: str = "binary_cross_entropy"
    # binary_focal_loss: the power of the factor (>= 0).
    gamma: float = 2.0
    # binary_focal_loss: the positives' weight, in (0, 1); jrc_loss: the calibration
    # part's weight, in [0, 1].
    alpha: float = 0.5
    # softmax_cross_entropy: the share of the target spread over all classes, in [0, 1].
    label_smoothing: float = 0.0
    # jrc_loss: the id feature whose first id per row is the row's session.
    session_name: str = ""

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"LossSpec.name={self.name!r}; allowed: {', '.join(LOSSES)}")
        checks = {"gamma": (lambda v: v >= 0, ">= 0"),
                  "alpha": ((lambda v: 0 < v < 1, "in (0, 1)") if self.name == "binary_focal_loss"
                            else (lambda v: 0 <= v <= 1, "in [0, 1]")),
                  "label_smoothing": (lambda v: 0 <= v <= 1, "in [0, 1]")}
        for field_name, (ok, allowed) in checks.items():
            value = getattr(self, field_name)
            if not (math.isfinite(value) and ok(value)):
                raise ValueError(f"LossSpec.{field_name}={value}; allowed: a number {allowed}")
        if self.name == "jrc_loss" and not self.session_name:
            raise ValueError("LossSpec.session_name is empty; jrc_loss needs the id feature "
                             "that names each row's session")


def binary_focal_rows(logits: torch.Tensor, labels: torch.Tensor, gamma: float,
                      alpha: float) -> torch.Tensor:
    """Focal loss of logits and labels in [0, 1] (B,) -> (B,) (see the module docstring)."""
    p = torch.sigmoid(logits)
    factor = alpha * labels * (1 - p) ** gamma + (1 - alpha) * (1 - labels) * p ** gamma
    return factor.detach() * F.binary_cross_entropy_with_logits(logits, labels,
                                                                 reduction="none")


def softmax_rows(logits: torch.Tensor, labels: torch.Tensor,
                 label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross entropy of logits (B, C) and class ids (B,) -> (B,)."""
    return F.cross_entropy(logits, labels.long(), reduction="none",
                           label_smoothing=label_smoothing)


def session_index(sessions: torch.Tensor) -> torch.Tensor:
    """Session ids (B,) -> each row's session as a number in [0, B), rows of one id
    sharing one number (fixed shapes: a sort, not ``torch.unique``)."""
    order = torch.argsort(sessions)
    ordered = sessions[order]
    starts = torch.ones_like(ordered, dtype=torch.int64)
    starts[1:] = (ordered[1:] != ordered[:-1]).long()
    return torch.empty_like(order).scatter_(0, order, torch.cumsum(starts, 0) - 1)


def _session_logsumexp(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(values))) of each session's rows (B,) -> (B,) by session number."""
    with torch.no_grad():  # the shift changes no value, so no gradient flows through it
        shift = torch.full_like(values, _NOT_A_COMPETITOR).scatter_reduce(
            0, index, values, "amax")
    sums = torch.zeros_like(values).scatter_add(0, index, torch.exp(values - shift[index]))
    # Numbers no row has keep a sum of 0: clamped, so that log gives no inf (never read).
    return shift + torch.log(sums.clamp_min(torch.finfo(sums.dtype).tiny))


def jrc_rows(logits: torch.Tensor, labels: torch.Tensor, sessions: torch.Tensor,
             alpha: float) -> torch.Tensor:
    """JRC loss of logits (B, 2), 0/1 labels (B,) and session ids (B,) -> (B,) (see the
    module docstring)."""
    classes = labels.long()
    calibration = F.cross_entropy(logits, classes, reduction="none")
    positive = classes == 1
    index = session_index(sessions)
    # A positive's rivals are its session's negatives on the positive logit; a
    # negative's, its session's positives on the negative logit.
    rivals_of_positives = _session_logsumexp(
        torch.where(positive, _NOT_A_COMPETITOR, logits[:, 1]), index)
    rivals_of_negatives = _session_logsumexp(
        torch.where(positive, logits[:, 0], _NOT_A_COMPETITOR), index)
    rivals = torch.where(positive, rivals_of_positives[index], rivals_of_negatives[index])
    own = logits.gather(1, classes.unsqueeze(1)).squeeze(1)
    ranking = F.softplus(rivals - own)
    return alpha * calibration + (1 - alpha) * ranking


def loss_rows(spec: LossSpec, logits: torch.Tensor, labels: torch.Tensor,
              sessions: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's loss (B,) of ``spec`` (``sessions``: jrc_loss's session ids)."""
    if spec.name == "l2_loss":
        return F.mse_loss(logits, labels, reduction="none")
    if spec.name == "binary_focal_loss":
        return binary_focal_rows(logits, labels, spec.gamma, spec.alpha)
    if spec.name == "softmax_cross_entropy":
        return softmax_rows(logits, labels, spec.label_smoothing)
    if spec.name == "jrc_loss":
        if sessions is None:
            raise ValueError("jrc_loss needs each row's session id")
        return jrc_rows(logits, labels, sessions, spec.alpha)
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none")


def task_loss(spec: LossSpec | str, logits: torch.Tensor, labels: torch.Tensor,
              weights: torch.Tensor | None = None,
              sessions: torch.Tensor | None = None) -> torch.Tensor:
    """One loss (float32 scalar) over a batch: the mean of ``loss_rows``, or with
    ``weights`` (B,) the weighted mean sum(w * loss) / sum(w) (0 when every weight is 0).
    ``spec``: a LossSpec, or a loss name with its default options."""
    spec = LossSpec(spec) if isinstance(spec, str) else spec
    rows = loss_rows(spec, logits, labels, sessions)
    if weights is None:
        return rows.mean()
    return (rows * weights).sum() / weights.sum().clamp_min(torch.finfo(torch.float32).tiny)


def match_loss(similarity: torch.Tensor, positive: str, weights: torch.Tensor | None = None,
               label_smoothing: float = 0.0) -> torch.Tensor:
    """A match model's softmax cross entropy (float32 scalar) of its (B, K) similarities,
    each row's positive at column i of row i (``positive`` "diagonal", in-batch negatives)
    or at column 0 ("first"); the mean over the rows, or with ``weights`` (B,) the
    weighted mean (0 when every weight is 0). Columns of -inf (a row's empty
    hard-negative slots) are no candidates: they get no probability, and
    ``label_smoothing`` spreads its share over each row's finite columns alone. No host
    reads."""
    rows = similarity.shape[0]
    target = torch.arange(rows, device=similarity.device) if positive == "diagonal" \
        else torch.zeros(rows, dtype=torch.int64, device=similarity.device)
    similarity = similarity.float()
    per_row = torch.nn.functional.cross_entropy(similarity, target, reduction="none")
    if label_smoothing > 0:
        candidates = torch.isfinite(similarity)
        log_probs = torch.log_softmax(similarity, dim=-1)
        spread = -log_probs.masked_fill(torch.logical_not(candidates), 0.0).sum(dim=-1) \
            / candidates.sum(dim=-1)
        per_row = (1.0 - label_smoothing) * per_row + label_smoothing * spread
    if weights is None:
        return per_row.mean()
    return (per_row * weights).sum() / weights.sum().clamp_min(torch.finfo(torch.float32).tiny)


def amm_loss(rows: torch.Tensor, weight: float,
             weights: torch.Tensor | None = None) -> torch.Tensor:
    """DAT's adaptive-mimic loss (float32 scalar) of its rows' terms (B,)
    (``hashrec.models.match.amm_rows``), as TorchEasyRec defines it: ``weight`` times
    their SUM over the rows (not their mean), or with ``weights`` (B,) ``weight`` times
    the weighted mean sum(w * term) / sum(w) (0 when every weight is 0). No host reads."""
    rows = rows.float()
    if weights is None:
        return weight * rows.sum()
    return weight * (rows * weights).sum() / weights.sum().clamp_min(
        torch.finfo(torch.float32).tiny)

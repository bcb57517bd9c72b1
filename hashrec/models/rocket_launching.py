"""RocketLaunching: a light network trained beside a booster network that teaches it
(Zhou et al. 2018, https://arxiv.org/abs/1708.04106), a ranking model.

The DEEP feature groups, concatenated in group order (B, D) (TorchEasyRec's configs have
one group; it reads the first), go through the optional ``share_mlp``, S. The booster
network is ``booster_mlp`` over S, then a linear layer to the logits; the light network
is ``light_mlp`` over S held constant (it trains neither S nor the embeddings, as in
TorchEasyRec), then a linear layer to its logits.

Training (the model in train mode) runs both and trains on the sum of

* each loss of ``model_config.losses`` on the light logits (``<loss>_light``) and on the
  booster logits (``<loss>_booster``);
* ``hint_l2_loss``: the squared difference of the light and the booster logits, the
  booster's held constant (the hint teaches the light network only), its mean;
* with ``feature_based_distillation``: for each light hidden layer, in order, the first
  booster hidden layer of the same width, ``similarity_<k>`` (k counting the pairs):
  COSINE -0.1 * the mean over rows of the cosine of the two layers' outputs, EUCLID the
  square root of the sum over rows of their squared distance, the booster's held
  constant. TorchEasyRec computes EUCLID for INNER_PRODUCT too; the config validation
  refuses INNER_PRODUCT.

With sample weights every mean is the weighted mean and EUCLID's sum is B times the
weighted mean, as TorchEasyRec weighs rows by w / mean(w).

Evaluation, export and predict run the light network alone, as TorchEasyRec serves it:
its outputs are ``logits_light`` and ``probs_light`` (``y_light`` with l2_loss), its
metrics ``<metric>_light``, the evaluation's losses ``<loss>_light``. In training the
forward also gives ``logits_booster`` and ``probs_booster``.

The dense network returns, in train mode, one tensor of fixed shape: the light logits,
the booster logits and each similarity pair's row term side by side, (B, 2C + pairs),
which ``losses_from_logits`` and ``predictions`` read (CUDA-graph friendly).

No ``from __future__ import annotations`` here: TorchScript reads ``RocketNet``'s
attribute annotations as types.
"""

import torch
from torch import nn
from torch.nn import functional as F

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.losses import task_loss
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.mmoe import deep_groups_merged
from hashrec.models.outputs import task_outputs
from hashrec.modules import MLP

HINT_LOSS = "hint_l2_loss"
BOOSTER = "_booster"
# The Similarity enum value of COSINE (model.proto).
COSINE = 0
# The cosine similarity's weight in the loss (negative: a larger similarity lowers it).
COSINE_WEIGHT = -0.1


class RocketNet(nn.Module):
    """RocketLaunching's dense network, shared by the eager model and its scripted export.

    ``forward([features (B, D)])``: in eval mode the light logits (B,), or (B, C) of C
    classes; in train mode (B, 2C + len(light_layers)), the light logits, the booster
    logits, then each similarity pair's row term.

    Args:
        share: the shared MLP (identity for none).
        light, booster: the two networks' ``MLP``s over the shared output.
        light_out, booster_out: their linear layers to the logits.
        light_layers, booster_layers: the similarity pairs' hidden layers (indices).
        cosine: the pairs' term is the cosine (else the squared Euclidean distance).
    """

    light_layers: list[int]
    booster_layers: list[int]

    def __init__(self, share: nn.Module, light: nn.Module, light_out: nn.Module,
                 booster: nn.Module, booster_out: nn.Module, light_layers: list[int],
                 booster_layers: list[int], cosine: bool) -> None:
        super().__init__()
        self.share = share
        self.light = light
        self.light_out = light_out
        self.booster = booster
        self.booster_out = booster_out
        self.light_layers = list(light_layers)
        self.booster_layers = list(booster_layers)
        self.cosine = cosine

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        shared = self.share(inputs[0])
        light_hidden = self.light.hidden_outputs(shared.detach())
        light = self.light_out(light_hidden[-1])
        if not self.training:
            return light.squeeze(-1) if light.shape[-1] == 1 else light
        booster_hidden = self.booster.hidden_outputs(shared)
        parts = [light, self.booster_out(booster_hidden[-1])]
        for i, j in zip(self.light_layers, self.booster_layers):
            parts.append(self._row_term(light_hidden[i], booster_hidden[j].detach()))
        return torch.cat(parts, dim=-1)

    def _row_term(self, light: torch.Tensor, booster: torch.Tensor) -> torch.Tensor:
        """(B, 1): the rows' cosine, or squared distance, of a pair of hidden outputs."""
        if self.cosine:
            return (F.normalize(booster, dim=1) * F.normalize(light, dim=1)).sum(
                dim=1, keepdim=True)
        return ((booster - light) ** 2).sum(dim=1, keepdim=True)


class RocketLaunching(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group.
        net: the dense network (``RocketNet``).
        similarity_pairs: (light layer, booster layer) of each ``similarity_<k>``.
    """

    kind = "rocket_launching"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.rocket_launching
        self.deep_group = deep_groups_merged(self, self.kind)
        self.input_groups = [self.deep_group]
        share, width = optional_mlp(config, "share_mlp", self.deep_group.dim,
                                    "rocket_launching.share_mlp")
        light = MLP(width, mlp_options(config.light_mlp, "rocket_launching.light_mlp"))
        booster = MLP(width, mlp_options(config.booster_mlp, "rocket_launching.booster_mlp"))
        self.similarity_pairs = _similarity_pairs(config) \
            if config.feature_based_distillation else []
        classes = self.num_class
        self.net = RocketNet(
            share or nn.Identity(), light, nn.Linear(light.output_dim(), classes),
            booster, nn.Linear(booster.output_dim(), classes),
            [i for i, _ in self.similarity_pairs], [j for _, j in self.similarity_pairs],
            config.feature_distillation_function == COSINE)
        task = self.tasks[0]
        # What evaluation reports (the light network's losses), and what training adds.
        self.eval_losses = self.losses
        self.losses = (*(name for spec in task.losses
                         for name in (spec.name + BOOSTER, spec.name + task.suffix)),
                       *(f"similarity_{k}" for k in range(len(self.similarity_pairs))),
                       HINT_LOSS)
        self.cosine = self.net.cosine

    def _split(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                     torch.Tensor]:
        """The train-mode network output -> (light, booster logits, (B,) or (B, C) each;
        the similarity row terms (B, pairs))."""
        c = self.num_class
        light, booster = logits[:, :c], logits[:, c:2 * c]
        if c == 1:
            light, booster = light.squeeze(-1), booster.squeeze(-1)
        return light, booster, logits[:, 2 * c:]

    def task_logits(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """The light network's logits (of the train-mode output too)."""
        return [self._split(logits)[0]] if self.training else [logits]

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The light network's outputs (``_light``); in train mode the booster's too."""
        task = self.tasks[0]
        if not self.training:
            return super().predictions(logits)
        light, booster, _ = self._split(logits)
        return {**task_outputs([light], [task.suffix], [task.regression]),
                **task_outputs([booster], [BOOSTER], [task.regression])}

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           *rest: torch.Tensor) -> dict[str, torch.Tensor]:
        """In eval mode the light network's losses; in train mode every loss of
        ``losses`` (see the module docstring)."""
        if not self.training:
            return super().losses_from_logits(logits, labels, *rest)
        task = self.tasks[0]
        weights = rest[0] if self.weighted else None
        sessions = rest[-1] if self.session_names else None
        light, booster, terms = self._split(logits)
        out = {}
        for spec in task.losses:
            rows_sessions = None if spec.name != "jrc_loss" else \
                sessions[:, self.session_names.index(spec.session_name)]
            out[spec.name + BOOSTER] = task_loss(spec, booster, labels, weights, rows_sessions)
            out[spec.name + task.suffix] = task_loss(spec, light, labels, weights,
                                                     rows_sessions)
        for k in range(terms.shape[1]):
            mean = _mean(terms[:, k], weights)
            out[f"similarity_{k}"] = COSINE_WEIGHT * mean if self.cosine else \
                torch.sqrt(terms.shape[0] * mean)
        hint = (light - booster.detach()) ** 2
        out[HINT_LOSS] = _mean(hint if hint.dim() == 1 else hint.mean(dim=-1), weights)
        return out

    def loss(self, predictions: dict[str, torch.Tensor], batch,
             targets: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """The light network's losses (eval mode; see ``RankModel.loss``).

        Raises:
            ModelError: in train mode, whose losses need the similarity terms: use
                ``losses_from_logits`` of the dense network's output.
        """
        if self.training:
            raise ModelError("rocket_launching's training losses read the dense network's "
                             "output (losses_from_logits(dense_forward(...))); loss() of "
                             "the predictions gives the evaluation's, in eval mode")
        return super().loss(predictions, batch, targets)


def _mean(rows: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``rows`` (B,), weighted by ``weights`` where given."""
    if weights is None:
        return rows.mean()
    return (rows * weights).sum() / weights.sum().clamp_min(torch.finfo(torch.float32).tiny)


def _similarity_pairs(config) -> list[tuple[int, int]]:
    """(light layer, booster layer) pairs: each light hidden layer with the first booster
    hidden layer of its width.

    Raises:
        ModelError: no light layer has a booster layer of its width.
    """
    light = list(config.light_mlp.hidden_units)
    booster = list(config.booster_mlp.hidden_units)
    pairs = [(i, booster.index(width)) for i, width in enumerate(light) if width in booster]
    if not pairs:
        raise ModelError(
            f"rocket_launching.feature_based_distillation pairs each light_mlp hidden layer "
            f"with a booster_mlp hidden layer of the same width, and none matches (light_mlp "
            f"{light}, booster_mlp {booster}): give them a width in common, or set "
            f"feature_based_distillation: false")
    return pairs

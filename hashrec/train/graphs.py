"""The dense network's forward and backward as CUDA graphs.

A training step on one GPU is bound by the host: the dense network alone is a few
hundred small kernels per step (towers, DIN attention, loss and their backward),
each launched from Python. ``DenseGraphs`` captures the dense network plus the loss
(``RankModel.dense_from_inputs`` and ``losses_from_logits``) once per input shape
with ``torch.cuda.make_graphed_callables`` and replays it, forward and backward, as
two graph launches. The embedding lookups, whose shapes change every step, stay
eager around it; gradients reach the embedding outputs through the graph as usual.

When a shape is captured: on its second occurrence (the first batch of a run and
a shorter last batch of an epoch run eagerly), for at most ``MAX_GRAPHS`` shapes;
other shapes run eagerly. Capturing runs the dense network a few times without
updating anything (gradients go nowhere) except BatchNorm running statistics, if
the model has any.

When a capture fails (an op that cannot be captured, such as a host read in a
custom module), the failure is logged once and every later step runs eagerly.
``train_config.dense_cuda_graph: false`` switches graphs off; on the CPU they are
never used.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch import nn

logger = logging.getLogger("hashrec.train")

MAX_GRAPHS = 4
CAPTURE_AFTER = 2  # occurrences of an input shape before it is captured
WARMUP_ITERS = 3   # eager runs on a side stream before a capture (torch's requirement)
# How torch's warning about a gradient accumulator's stream begins.
STREAM_MISMATCH = "The AccumulateGrad node's stream does not match"


@contextlib.contextmanager
def thread_local_capture():
    """Graph captures inside capture in the ``thread_local`` error mode.

    ``make_graphed_callables`` captures in the ``global`` mode, where a CUDA call
    that is unsafe during a capture fails on any thread, and fails the capture with
    it: the loader's pin-memory thread allocating pinned memory for a batch of a
    new size (a shorter last batch) killed training. ``thread_local`` still checks
    the capturing thread, which is the one whose work the graph records.
    """
    graph_init = torch.cuda.graph.__init__

    def init(self, cuda_graph, pool=None, stream=None, capture_error_mode="thread_local",
             **kwargs):
        graph_init(self, cuda_graph, pool=pool, stream=stream,
                   capture_error_mode=capture_error_mode, **kwargs)

    torch.cuda.graph.__init__ = init
    try:
        yield
    finally:
        torch.cuda.graph.__init__ = graph_init


@contextlib.contextmanager
def quiet_warmup_streams():
    """No warning about the warmup's gradient streams inside a capture.

    ``make_graphed_callables`` warms the network up on a stream of its own, while the
    parameters' gradient accumulators the eager steps before the capture made belong
    to the caller's stream; torch warns about that mismatch once, from inside the
    warmup (seen on an H200, torch 2.11), although it only orders the warmup's
    gradients after the caller's stream. The warning is ignored for the capture
    alone, where the mismatch is expected (torch's own switch for it,
    ``set_warn_on_accumulate_grad_stream_mismatch(False)``, did not silence it there).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=STREAM_MISMATCH, category=UserWarning)
        yield


class _DenseLoss(nn.Module):
    """The dense network and the loss as one module of tensors: (*inputs, *targets) ->
    (logits detached, losses (n,)); targets: ``model.targets(batch)`` (labels, then row
    weights and session ids where the model has them)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.parts = nn.ModuleList(model.dense_modules())
        self._model = (model,)  # not a submodule: the embedding stays out
        self._targets = model.target_count

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self._model[0]
        inputs, targets = args[:-self._targets], args[-self._targets:]
        logits = model.dense_from_inputs(*inputs).float()
        losses = model.losses_from_logits(logits, *targets)
        return logits.detach(), torch.stack(list(losses.values()))


def _signature(tensors) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.requires_grad) for t in tensors)


class DenseGraphs:
    """Runs the dense network and the loss of a training step, replaying CUDA graphs
    where it can (see the module docstring).

    Args:
        model: a ``RankModel`` that implements ``dense_inputs``/``dense_from_inputs``.
        autocast: a callable returning the forward's autocast context (captures run in
            it, so the graph holds the mixed-precision kernels).
        enabled: False (or a model without the split, or a CPU model) runs eagerly.
        replayable: keep what ``replay_again`` needs of each replayed step (its inputs and
            random state), for a step that takes more than one backward of its graph.
    """

    def __init__(self, model, autocast, enabled: bool = True,
                 replayable: bool = False) -> None:
        self.model = model
        self.autocast = autocast
        self.enabled = enabled and self._supported(model)
        self._eager = _DenseLoss(model)  # uncaptured shapes (captures take fresh copies)
        self._graphs: dict[tuple, nn.Module] = {}
        self._seen: dict[tuple, int] = {}
        self.replayable = replayable
        self._replayed = None  # (graph, inputs, random state) of the last replayed step

    @staticmethod
    def _supported(model) -> bool:
        if not torch.cuda.is_available():
            return False
        try:
            device = next(p.device for m in model.dense_modules() for p in m.parameters())
        except StopIteration:
            return False
        from hashrec.models.rank_model import RankModel

        return device.type == "cuda" and type(model).dense_inputs is not RankModel.dense_inputs

    @property
    def captured(self) -> int:
        """How many input shapes have a graph."""
        return len(self._graphs)

    def __call__(self, embedded, batch, targets=None) -> dict[str, torch.Tensor]:
        """Per-loss scalar tensors of the step (the dense forward run or replayed);
        ``targets``: the batch's ``model.targets(batch)``, when the caller has them."""
        return self.losses_and_logits(embedded, batch, targets)[0]

    def losses_and_logits(self, embedded, batch, targets=None
                          ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """As ``__call__``, and the step's float32 logits, detached (what the train metrics
        read). A replayed graph's logits are its output buffer, of a fixed shape, which
        the next replay overwrites: read them (on the device) before it."""
        model = self.model
        targets = model.targets(batch) if targets is None else targets
        if not self.enabled:
            with self.autocast():
                logits = model.dense_forward(embedded, batch).float()
            return model.losses_from_logits(logits, *targets), logits.detach()
        with self.autocast():
            inputs = (*model.dense_inputs(embedded, batch), *targets)
        graph = self._graph_for(inputs)
        self._replayed = None
        if graph is None:
            with self.autocast():
                logits, losses = self._eager(*inputs)
        else:
            if self.replayable:  # the generator's state before the replay (host-side)
                self._replayed = (graph, inputs, torch.cuda.get_rng_state(inputs[0].device))
            logits, losses = graph(*inputs)
        return dict(zip(model.losses, losses.unbind(0))), logits

    @property
    def replayed(self) -> bool:
        """Whether the last ``losses_and_logits`` replayed a graph (known when
        ``replayable``)."""
        return self._replayed is not None

    def replay_again(self) -> dict[str, torch.Tensor]:
        """The last step's per-loss tensors once more, from a new replay of its graph on the
        same inputs and random state (the same values, dropout masks included), for one
        more backward: a captured backward runs once per forward replay, as its capture
        reuses the memory of the activations it has read (``make_graphed_callables``
        captures it without retaining them), so a second backward of one replay reads
        overwritten activations. The logits buffer is rewritten with the same values."""
        if self._replayed is None:
            raise RuntimeError("DenseGraphs.replay_again: the last step replayed no graph, "
                               "or the graphs were built without replayable")
        graph, inputs, state = self._replayed
        torch.cuda.set_rng_state(state, inputs[0].device)
        _, losses = graph(*inputs)
        return dict(zip(self.model.losses, losses.unbind(0)))

    def _graph_for(self, inputs) -> nn.Module | None:
        key = _signature(inputs)
        graph = self._graphs.get(key)
        if graph is not None or len(self._graphs) >= MAX_GRAPHS:
            return graph
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] < CAPTURE_AFTER:
            return None
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
        try:
            with self.autocast(), thread_local_capture(), quiet_warmup_streams():
                graph = torch.cuda.make_graphed_callables(
                    _DenseLoss(self.model), samples, num_warmup_iters=WARMUP_ITERS,
                    allow_unused_input=True)
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            self.enabled = False
            logger.warning("dense network CUDA graph capture failed, running eagerly from "
                           "here on (train_config.dense_cuda_graph: false silences this): "
                           "%s: %s", type(err).__name__, err)
            return None
        self._graphs[key] = graph
        logger.info("captured the dense network as a CUDA graph for inputs %s",
                    ", ".join("x".join(map(str, shape)) for shape, _, _ in key))
        return graph

"""The throttled training progress line and table counters.

Every ``log_step_count_steps`` steps, and after the last step of a run, rank 0 logs one
line (samples/s over the time of the steps since the last line: checkpoints, evaluations
and incremental dumps left out)::

    step 200 | loss 0.61234 | 10520.3 samples/s | 200/1220 steps, about 1m 39s left |
    lr dense 0.001 sparse 0.01 | user_id size 9120 load 0.56 evict 0 reject 3200

(with ``train_metrics``, their decayed values after the loss: ``| train auc 0.71234 |``;
with Pareto loss weights, ``hashrec.train.pareto``, their mean over the line's steps after
the loss: ``| loss weights (binary_cross_entropy_ctr 0.41234, ...) |``)

with the steps the run trains in all (``num_steps``, or ``num_epochs`` epochs once the
steps of an epoch are known) and the time those left take at the line's rate, and, per
dynamic table, its size (a fused storage's followed by each of its tables':
``deep size 9 (user_id 4, cate_id 5)``; they share the storage's capacity, the sum of
their max_capacity), load factor, evictions and admission rejections (ids not yet seen
often enough to enter the table), cumulative since the table was built, its refused
inserts (full buckets that kept their entries) once there are any (a fused storage's
rejections and refusals, once there are any, followed by each of its tables':
``reject 7 (user_id 2, cate_id 5)``), and its admission counts evicted once there are
any (``counter_evict``: ids whose count the full counter table, of ``counter_capacity``
slots, dropped, its lowest, to count other ids; they start counting again). A CACHING table (host rows with a device cache) adds its cache
hit rate over the rows its lookups read (``cache_hit 0.87``). A ZCH table (``zch``) gives
its rows held, load, ids given a row, rows given to another id at eviction rounds and
unique ids of a step left without a row, read as zeros, all since the run started:
``item_id size 900 load 0.90 assigned 1020 evict 120 no_row 3400``. Under several
ranks, loss, samples/s and the dynamic tables' counters are global (summed through
``reduce``; a ZCH table is replicated, every rank counting the global batch, so its
counters are rank 0's), and the line adds the embedding exchange time per step:
``a2a 3.21 ms/step``.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager

from hashrec.train.errors import TrainError

logger = logging.getLogger("hashrec.train")


def table_counters(dynamic_tables: dict, fused_sizes: dict | None = None
                   ) -> dict[str, dict[str, float]]:
    """Per dynamic table: size, capacity, load_factor, evictions, refused,
    admission_rejected, counter_evictions; a CACHING table's cache_lookups and cache_hits;
    a fused storage's ``size/<table>`` per table of ``fused_sizes`` ({storage: {table:
    size}}, ``EmbeddingCollection.fused_table_sizes``) and, from its table's ``stats()``,
    ``admission_rejected/<table>`` and ``refused/<table>``."""
    out = {}
    for name, table in dynamic_tables.items():
        stats = table.stats()
        out[name] = {
            "size": float(stats.get("size", table.size())),
            "capacity": float(stats.get("capacity", table.capacity())),
            "load_factor": float(table.load_factor()),
            "evictions": float(stats.get("evictions", 0)),
            "refused": float(stats.get("refused", 0)),
            "admission_rejected": float(stats.get("admission_rejected", 0)),
            "counter_evictions": float(stats.get("counter_evictions", 0)),
        }
        for table, size in (fused_sizes or {}).get(name, {}).items():
            out[name][f"size/{table}"] = float(size)
        out[name].update({key: float(value) for key, value in stats.items()
                          if key.startswith(("admission_rejected/", "refused/"))})
        if "cache_lookups" in stats:
            out[name].update(cache_lookups=float(stats["cache_lookups"]),
                             cache_hits=float(stats["cache_hits"]))
    return out


def zch_counters(remappers: dict) -> dict[str, dict[str, float]]:
    """Per ZCH table (``EmbeddingCollection.zch_remappers``): ``ZchRemapper.counters``,
    the same on every rank (not to be summed over the ranks)."""
    return {name: remapper.counters() for name, remapper in remappers.items()}


def format_tables(counters: dict[str, dict[str, float]]) -> str:
    """``name size S load L evict E reject R`` (a fused storage's size followed by its
    tables', ``deep size 9 (user_id 4, cate_id 5)``, and its rejections and refusals
    likewise once there are any, ``reject 7 (user_id 2, cate_id 5)``), plus ``refused F``
    once a table has refused inserts (keys that then read as the initializer and are not
    trained) and ``counter_evict C`` once its admission counter has evicted counts, and
    ``cache_hit H`` (hits / lookups) once a CACHING table's cache was read; a ZCH table's
    (``zch_counters``) ``name size S load L assigned A evict E no_row N``."""
    def line(name: str, c: dict[str, float]) -> str:
        if "without_row" in c:  # a ZCH table
            return (f"{name} size {int(c['size'])} load {c['load_factor']:.2f} assigned "
                    f"{int(c['assigned'])} evict {int(c['evictions'])} "
                    f"no_row {int(c['without_row'])}")
        text = (f"{name} size {int(c['size'])}{_by_table(c, 'size')} "
                f"load {c['load_factor']:.2f} evict {int(c['evictions'])} "
                f"reject {int(c['admission_rejected'])}")
        if int(c["admission_rejected"]):
            text += _by_table(c, "admission_rejected")
        for key, label in (("refused", "refused"), ("counter_evictions", "counter_evict")):
            if int(c.get(key, 0)):
                text += f" {label} {int(c[key])}{_by_table(c, key)}"
        if c.get("cache_lookups"):
            text += f" cache_hit {c['cache_hits'] / c['cache_lookups']:.2f}"
        return text

    return " | ".join(line(name, c) for name, c in counters.items())


def _by_table(c: dict[str, float], counter: str) -> str:
    """`` (user_id 4, cate_id 5)``: a fused storage's ``<counter>/<table>`` figures, or ""."""
    prefix = counter + "/"
    members = ", ".join(f"{key[len(prefix):]} {int(v)}" for key, v in c.items()
                        if key.startswith(prefix))
    return f" ({members})" if members else ""


def duration(seconds: float) -> str:
    """``45s``, ``12m 5s`` or ``3h 07m``."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def total_steps(num_steps: int, max_epochs: int | None, epoch_steps: int) -> int:
    """The steps a run trains in all: ``num_steps``, or ``max_epochs`` epochs of
    ``epoch_steps`` (0: not known yet), whichever ends it first; 0 when not known."""
    by_epochs = max_epochs * epoch_steps if max_epochs and epoch_steps else 0
    ends = [n for n in (num_steps, by_epochs) if n]
    return min(ends) if ends and (by_epochs or not max_epochs) else 0


class ProgressLog:
    """Throttled progress reporting of one training run (only ``rank`` 0 logs).

    Args:
        every: log every this many steps (``log_step_count_steps``); 0 disables.
        rank: this process's rank.
        reduce: sums named scalars over ranks (a collective every rank calls at each
            report); None for a single process.
    """

    def __init__(self, every: int, rank: int = 0, reduce=None) -> None:
        self.every = every
        self.rank = rank
        self.reduce = reduce
        self._since = time.perf_counter()
        self._paused = 0.0  # seconds of the window spent outside training steps
        self._started = False
        self._samples = 0
        self._loss_sum = 0.0
        self._loss_steps = 0
        self._part_sums: dict = {}
        self._weight_sums: dict = {}

    def start(self) -> None:
        """The first batch is ready: the first window's clock starts here, not at the
        setup before it (loader workers starting, a resumed epoch's batches skipped).
        Later calls do nothing."""
        if not self._started:
            self._started = True
            self._since, self._paused = time.perf_counter(), 0.0

    @contextmanager
    def paused(self):
        """Leave the time of the block (a checkpoint, an evaluation, a dump) out of the
        window's samples/s, which counts the training steps' time only."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start

    def record(self, batch_size: int, loss, parts: dict | None = None) -> None:
        """Count one step; ``loss`` may be a device tensor (read only when reporting).
        ``parts``: the losses summed into ``loss`` by name (a multi-task model's per
        task), reported beside it when there are several."""
        self._samples += batch_size
        self._loss_sum += loss
        self._loss_steps += 1
        if parts is not None and len(parts) > 1:
            for name, value in parts.items():
                self._part_sums[name] = self._part_sums.get(name, 0.0) + value.detach()

    def record_weights(self, weights: dict) -> None:
        """The weights of the losses in the step's ``loss`` by name, where the step solved
        them (Pareto loss weights; device tensors, read only when reporting), each step
        with ``record``: reported as their mean over the line's steps."""
        for name, value in weights.items():
            self._weight_sums[name] = self._weight_sums.get(name, 0.0) + value.detach()

    def check_finite(self, step: int) -> None:
        """Raise TrainError when the loss of the steps since the last report is NaN or
        infinite (on any rank: under several ranks a collective every rank calls), so
        that a diverged model is not saved over the checkpoints before it."""
        window = {"loss_sum": float(self._loss_sum), "loss_steps": float(self._loss_steps),
                  "ranks": 1.0}
        if self.reduce is not None:
            window = self.reduce(window)
        if window["loss_steps"]:
            self._raise_if_diverged(step, window["loss_sum"] / window["loss_steps"],
                                    window["loss_steps"] / window["ranks"])

    def _raise_if_diverged(self, step: int, loss: float, steps: float) -> None:
        if math.isfinite(loss):
            return
        raise TrainError(
            f"the training loss is {loss} at step {step} (the mean of the last "
            f"{int(steps)} step(s)): the model diverged, "
            f"and is not saved; the checkpoints before it are kept. Lower the learning "
            f"rates, set gradient clipping, or check the input for extreme values")

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @property
    def pending(self) -> bool:
        """Steps recorded since the last line, which the run's end reports (unless every
        is 0)."""
        return self.every > 0 and self._loss_steps > 0

    def report(self, step: int, lrs: dict[str, float], counters: dict,
               comm: tuple[float, int] | None = None, total: int = 0,
               metrics: dict[str, float] | None = None) -> dict[str, float]:
        """Log the line for ``step`` and reset the window; returns the window's scalars.

        ``comm``: (seconds, regions) the embedding exchanges took in the window
        (``CommTimer.drain``); shown per step when any exchange ran. ``total``: the steps
        the run trains in all (0: not known), shown with the time the steps left take
        at the window's rate (``200/1220 steps, about 12m 5s left``; checkpoints and
        evaluations to come not counted). ``metrics``: the train metrics' decayed values
        (``TrainMetrics.values``, global already), shown after the loss (``| train auc
        0.71234``) and returned as ``train_metric/<name>``.
        """
        elapsed = max(time.perf_counter() - self._since - self._paused, 1e-9)
        window = {"samples": float(self._samples), "loss_sum": float(self._loss_sum),
                  "loss_steps": float(self._loss_steps), "elapsed": elapsed,
                  "comm_seconds": comm[0] if comm else 0.0, "ranks": 1.0,
                  **{f"part/{name}": float(v) for name, v in self._part_sums.items()},
                  **{f"weight/{name}": float(v) for name, v in self._weight_sums.items()}}
        if self.reduce is not None:
            window = self.reduce(window)
        ranks = window["ranks"]
        loss = window["loss_sum"] / max(window["loss_steps"], 1)
        self._raise_if_diverged(step, loss, window["loss_steps"] / ranks)
        rate = window["samples"] / (window["elapsed"] / ranks)
        parts = {name: window[f"part/{name}"] / max(window["loss_steps"], 1)
                 for name in self._part_sums}
        weights = {name: window[f"weight/{name}"] / max(window["loss_steps"], 1)
                   for name in self._weight_sums}
        out = {"loss": loss, **{f"loss/{name}": v for name, v in parts.items()},
               **{f"loss_weight/{name}": v for name, v in weights.items()},
               "samples_per_second": rate,
               **{f"train_metric/{name}": v for name, v in (metrics or {}).items()}}
        steps = window["loss_steps"] / ranks
        if comm is not None and comm[1] and steps:
            out["a2a_ms_per_step"] = 1000.0 * window["comm_seconds"] / ranks / steps
        if self.rank == 0:
            lr_text = " ".join(f"{k} {v:.6g}" for k, v in lrs.items())
            shown = " (" + ", ".join(f"{k} {v:.5f}" for k, v in parts.items()) + ")" \
                if parts else ""
            line = f"step {step} | loss {loss:.5f}{shown} | "
            if weights:
                line += "loss weights (" + ", ".join(
                    f"{k} {v:.5f}" for k, v in weights.items()) + ") | "
            if metrics:
                line += "train " + " ".join(f"{k} {v:.5f}" for k, v in metrics.items()) + " | "
            line += f"{rate:.1f} samples/s | "
            if total > step and steps:
                left = (total - step) * window["elapsed"] / ranks / steps
                line += f"{step}/{total} steps, about {duration(left)} left | "
            line += f"lr {lr_text}"
            if "a2a_ms_per_step" in out:
                line += f" | a2a {out['a2a_ms_per_step']:.3f} ms/step"
            tables = format_tables(counters)
            logger.info(line + (f" | {tables}" if tables else ""))
        self._since = time.perf_counter()
        self._paused = 0.0
        self._samples = self._loss_steps = 0
        self._loss_sum = 0.0
        self._part_sums = {}
        self._weight_sums = {}
        return out

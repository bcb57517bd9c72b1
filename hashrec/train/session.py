"""Everything one training or evaluation run is built from a pipeline config.

A ``Session`` holds the feature set, the model (embedding collection on the
run's device), the dense optimizers and both learning-rate schedules, the mixed
precision settings and the data loaders' factory. ``rank`` / ``world_size``
select this process's share of the data; only rank 0 logs and writes files.
Under torchrun the ``DistContext`` shards the embedding collection's dynamic
storages over the ranks (see ``hashrec.train.distributed``); the storage
planner picks every dynamic storage's mode at build time.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from hashrec.config import save_pipeline_config
from hashrec.data import create_dataloader
from hashrec.data.sampler import negative_items
from hashrec.distributed import DistContext, single_process_context
from hashrec.embedding import EmbeddingCollection
from hashrec.features import build_feature_set
from hashrec.models import create_model
from hashrec.train.distributed import plan_storage_modes
from hashrec.train.errors import TrainError
from hashrec.train.metrics import check_metrics
from hashrec.train.optimizers import (
    DenseOptimizer,
    build_dense_optimizer,
    dense_parameters,
    sparse_optimizer_spec,
    sparse_schedule,
)
from hashrec.train.placement import CpuPlacement, place_training_process
from hashrec.train.precision import MixedPrecision, apply_tf32

logger = logging.getLogger("hashrec.train")

PIPELINE_CONFIG_FILE = "pipeline.config"
SEED = 0


def default_device(rank: int = 0) -> torch.device:
    """The GPU of this rank when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class Session:
    """The built pieces of one run (see the module docstring)."""

    config: object
    feature_set: object
    model: torch.nn.Module
    dense: DenseOptimizer
    sparse_schedule: object
    precision: MixedPrecision
    device: torch.device
    rank: int = 0
    world_size: int = 1
    ctx: DistContext | None = None
    cpu_placement: CpuPlacement | None = None
    # (the negative sampler's item table,) once read, (None,) without one: ``negative_items``
    _items: tuple = field(default=(), init=False, repr=False)

    @property
    def model_dir(self) -> str:
        return self.config.model_dir

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def negative_items(self):
        """The item table of ``data_config.negative_sampler`` (None without one), read on
        first use and kept: the input check, the training loader and every evaluation's
        share one read."""
        if not self._items:
            self._items = (negative_items(self.config.data_config),)
        return self._items[0]

    def loader(self, input_path: str, mode: str, epoch: int = 0):
        """Batches of ``input_path`` for this rank (``mode`` train or eval)."""
        if not input_path:
            name = "train_input_path" if mode == "train" else "eval_input_path"
            raise TrainError(f"{name} is empty; set it in the config or on the command line")
        return create_dataloader(self.config.data_config, self.feature_set, input_path, mode,
                                 rank=self.rank, world_size=self.world_size, seed=epoch,
                                 worker_cores=self._worker_cores(),
                                 items=self.negative_items())

    def train_stream(self, input_path: str, first_epoch: int, num_epochs: int | None):
        """One loader of this rank's training batches over epochs ``first_epoch`` on
        (``num_epochs`` of them, None: without end), as ``(epoch, batch or None)`` items
        (``create_dataloader``'s ``tag_epochs``); epoch ``e`` reads as ``loader(...,
        "train", e)``."""
        if not input_path:
            raise TrainError("train_input_path is empty; set it in the config or on the "
                             "command line")
        return create_dataloader(self.config.data_config, self.feature_set, input_path,
                                 "train", rank=self.rank, world_size=self.world_size,
                                 seed=first_epoch, num_epochs=num_epochs, tag_epochs=True,
                                 worker_cores=self._worker_cores(),
                                 items=self.negative_items())

    def _worker_cores(self) -> tuple[int, ...] | None:
        return self.cpu_placement.workers if self.cpu_placement is not None else None

    def set_learning_rates(self, step: int, epoch: int) -> dict[str, float]:
        """Apply both schedules for ``step``; returns {"dense": lr, "sparse": lr}, with each
        ``param_optimizers`` entry's rate after the dense one (``param_optimizers[0]``)."""
        dense_lr = self.dense.set_learning_rates(step, epoch)
        sparse_lr = self.sparse_schedule(step, epoch)
        self.model.embedding.set_learning_rate(sparse_lr)
        return {"dense": dense_lr, **self.dense.entry_rates(), "sparse": sparse_lr}


def build_session(config, rank: int = 0, world_size: int = 1,
                  device: torch.device | None = None,
                  ctx: DistContext | None = None, purpose: str = "training") -> Session:
    """Build the feature set, model, optimizers and precision of ``config``.

    ``ctx`` (from ``init_distributed``) overrides ``rank``, ``world_size`` and
    ``device``; with world size > 1 the dynamic tables are sharded over the ranks.
    ``purpose`` (training, evaluation, export, a tool's name) labels the storage plan's
    log line.

    Raises:
        TrainError: train_config missing or invalid (ModelError, FeatureError and
            ConfigError from lower layers pass through unchanged).
    """
    if not config.HasField("train_config"):
        raise TrainError("the pipeline config has no train_config (optimizers are required)")
    if ctx is not None:
        rank, world_size, device = ctx.rank, ctx.world_size, ctx.device
    device = device or default_device(rank)
    ctx = ctx or single_process_context(device)
    # One fixed seed: runs of the same config and data start from the same weights.
    torch.manual_seed(SEED)
    train_config = config.train_config
    apply_tf32(train_config, device)
    feature_set = build_feature_set(config)
    check_metrics(config.model_config, feature_set)
    sparse_spec = sparse_optimizer_spec(train_config.sparse_optimizer)
    modes = plan_storage_modes(feature_set, sparse_spec, int(config.data_config.batch_size), ctx,
                               purpose)
    embedding = EmbeddingCollection(feature_set.embedding_tables(),
                                    feature_set.embedding_features(), sparse_spec, device,
                                    dist=ctx, storage_modes=modes)
    model = create_model(config.model_config, feature_set, sparse_spec, device, embedding)
    model.to(device)
    _limit_host_threads(device, int(config.data_config.num_workers))
    placement = place_training_process(int(config.data_config.num_workers), world_size) \
        if device.type == "cuda" else None
    dense = build_dense_optimizer(train_config.dense_optimizer, dense_parameters(model))
    precision = MixedPrecision.create(
        train_config.mixed_precision, device,
        train_config.grad_scaler if train_config.HasField("grad_scaler") else None)
    return Session(config, feature_set, model, dense,
                   sparse_schedule(train_config.sparse_optimizer), precision, device, rank,
                   world_size, ctx, placement)


def _limit_host_threads(device: torch.device, loader_workers: int) -> None:
    """On a GPU the training process does little CPU work of its own; its default
    intra-op threads (one per core) would spin on the cores its loader workers need.
    Keep at most 4, and no more than the cores left over per local rank."""
    if device.type != "cuda":
        return
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    spare = (os.cpu_count() or 1) // max(local_ranks, 1) - loader_workers
    threads = max(1, min(4, spare, torch.get_num_threads()))
    if threads < torch.get_num_threads():
        logger.info("intra-op CPU threads of the training process: %d", threads)
        torch.set_num_threads(threads)


def write_pipeline_config(config, model_dir: str, rank: int = 0) -> str | None:
    """Write the effective config (after edits and overrides) to ``model_dir`` (rank 0)."""
    if rank != 0:
        return None
    path = os.path.join(model_dir, PIPELINE_CONFIG_FILE)
    save_pipeline_config(config, path)
    return path

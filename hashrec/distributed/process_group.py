"""Process-group setup from torchrun's environment, and its teardown.

``torchrun`` exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` to every worker. :func:`init_distributed` reads them, picks NCCL
when the worker has a CUDA device and gloo otherwise, binds the worker to
``cuda:LOCAL_RANK`` and returns a :class:`DistContext`. Without those variables
the same call returns a single-process context and creates no process group, so
every command runs unchanged with and without ``torchrun``.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hashrec.distributed.errors import DistributedError

logger = logging.getLogger("hashrec.distributed")

_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class DistContext:
    """Where this worker sits in the job.

    Attributes:
        rank: global rank in [0, world_size).
        world_size: number of workers.
        local_rank: rank on this host (selects the CUDA device).
        device: device this worker computes on (``cuda:<local_rank>`` or ``cpu``).
        is_main: True on rank 0, the only rank that logs and writes files.
        backend: ``nccl`` or ``gloo``; None when no process group exists.
        owns_group: True when :func:`init_distributed` created the process group
            (so :func:`teardown` destroys it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    is_main: bool = True
    backend: str | None = None
    owns_group: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")
        if self.is_main != (self.rank == 0):
            raise ValueError(f"is_main must equal rank == 0, got {self.is_main} on rank {self.rank}")
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} or None, got {self.backend!r}")

    @property
    def is_distributed(self) -> bool:
        """True when collectives must run (a process group exists and world_size > 1)."""
        return self.backend is not None and self.world_size > 1


def single_process_context(device: torch.device | str | None = None) -> DistContext:
    """Context of a job without torchrun: rank 0 of 1, no process group.

    Args:
        device: device to compute on; default ``cuda:0`` when CUDA is available, else cpu.
    """
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return DistContext(device=torch.device(device))


def _env_int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(
            f"environment variable {name}={raw!r} is not an integer; launch with torchrun "
            f"or unset the distributed variables") from None


def _tcp_address(env: Mapping[str, str]) -> str:
    host, port = env["MASTER_ADDR"], _env_int(env, "MASTER_PORT")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"tcp://{host}:{port}"


def _pick_backend(backend: str | None, use_cuda: bool) -> str:
    if backend is None:
        return "nccl" if use_cuda else "gloo"
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} or None, got {backend!r}")
    if backend == "nccl" and not use_cuda:
        raise DistributedError("backend 'nccl' needs CUDA devices; use 'gloo' on CPU")
    return backend


def _context_from_group(local_rank: int, use_cuda: bool) -> DistContext:
    """Context for a process group that someone else already initialized."""
    rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    return DistContext(rank=rank, world_size=dist.get_world_size(), local_rank=local_rank,
                       device=device, is_main=rank == 0, backend=dist.get_backend(),
                       owns_group=False)


# How long a collective waits for the other ranks before the job fails, unless
# HASHREC_COLLECTIVE_TIMEOUT_S says otherwise: a rank that hangs (rather than dies) holds
# the others this long.
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def collective_timeout_s(env: Mapping[str, str]) -> float:
    """``HASHREC_COLLECTIVE_TIMEOUT_S`` from ``env`` (seconds > 0), or the default.

    Raises:
        DistributedError: the value is not a positive number.
    """
    text = env.get("HASHREC_COLLECTIVE_TIMEOUT_S")
    if text is None or not text.strip():
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise DistributedError(f"HASHREC_COLLECTIVE_TIMEOUT_S={text!r}: expected a number of "
                               f"seconds > 0")
    return value


def init_distributed(backend: str | None = None, use_cuda: bool | None = None,
                     timeout_s: float | None = None,
                     env: Mapping[str, str] | None = None) -> DistContext:
    """Join the job that torchrun started, or run alone when there is none.

    Args:
        backend: ``nccl`` or ``gloo``; default NCCL when CUDA is used, else gloo.
        use_cuda: compute on ``cuda:LOCAL_RANK``; default: whenever CUDA is available.
        timeout_s: collective timeout of the process group; default
            ``HASHREC_COLLECTIVE_TIMEOUT_S`` from ``env``, else 30 minutes.
        env: environment to read (default ``os.environ``).

    Returns:
        The worker's :class:`DistContext`.

    Raises:
        DistributedError: the environment is partial or malformed, or a CUDA
            worker has no device for its LOCAL_RANK.
    """
    env = os.environ if env is None else env
    if use_cuda is None:
        use_cuda = torch.cuda.is_available()
    present = [name for name in _REQUIRED_ENV if name in env]
    if not present:
        return single_process_context("cuda:0" if use_cuda else "cpu")
    missing = [name for name in _REQUIRED_ENV if name not in env]
    if missing:
        raise DistributedError(
            f"distributed environment is partial: {', '.join(present)} set but "
            f"{', '.join(missing)} missing; launch with torchrun or unset them")
    rank, world_size = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    local_rank = _env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise DistributedError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices "
                f"are visible; check --nproc-per-node and CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(local_rank)
    if dist.is_initialized():
        return _context_from_group(local_rank, use_cuda)
    chosen = _pick_backend(backend, use_cuda)
    if timeout_s is None:
        timeout_s = collective_timeout_s(env)
    dist.init_process_group(backend=chosen, init_method=_tcp_address(env), rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                       is_main=rank == 0, backend=chosen, owns_group=True)


# Per context: a gloo group over the same ranks for host-side exchanges under NCCL.
_HOST_GROUPS: dict[int, tuple[DistContext, object]] = {}


def host_group(ctx: DistContext):
    """A gloo group of all ranks, or None when the default group already runs on the
    host (gloo) or a gloo group cannot be made.

    Small exchanges of host values (batch flags, sizes) go through it under NCCL:
    an NCCL collective and a read of its result would wait for all the device work
    queued before it. The group is created on first use, which every rank must reach
    in the same order of group creations (a collective call).
    """
    if ctx.backend != "nccl" or not ctx.is_distributed:
        return None
    if id(ctx) not in _HOST_GROUPS:
        try:
            group = dist.new_group(backend="gloo")
        except (RuntimeError, ValueError) as err:
            logger.warning("no gloo group for host-side exchanges (%s); they go through NCCL "
                           "and wait for the device", err)
            group = None
        _HOST_GROUPS[id(ctx)] = (ctx, group)
    return _HOST_GROUPS[id(ctx)][1]


def _host_side(ctx: DistContext, group) -> tuple[object, torch.device]:
    """(process group, tensor device) of a small exchange of host values: the host
    group when the exchange runs on the default group under NCCL, else ``group`` on
    the device its backend needs."""
    host = host_group(ctx) if group is None else None
    if host is not None:
        return host, torch.device("cpu")
    return group, ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def all_gather_ints(values: list, ctx: DistContext, group=None) -> list:
    """Every rank's ``values`` (ints, or equal-length lists of ints), by rank, without
    waiting for the device under NCCL (see ``host_group``)."""
    group, device = _host_side(ctx, group)
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return torch.stack(gathered).tolist()


def all_gather_objects(value, ctx: DistContext) -> list:
    """Every rank's picklable ``value``, by rank (``[value]`` on one rank), through the
    host (see ``host_group``): for small reports at the end of a run, not for steps."""
    if not ctx.is_distributed:
        return [value]
    group, _ = _host_side(ctx, None)
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def all_reduce_int(value: int, ctx: DistContext, op=dist.ReduceOp.SUM) -> int:
    """``value`` reduced over all ranks with ``op`` (``value`` itself on one rank),
    without waiting for the device under NCCL (see ``host_group``)."""
    if not ctx.is_distributed:
        return value
    group, device = _host_side(ctx, None)
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=op, group=group)
    return int(tensor.item())


def all_reduce_int_async(value: int, ctx: DistContext, op=dist.ReduceOp.SUM):
    """Starts :func:`all_reduce_int`; returns a function that waits for it and gives the
    result (for an exchange made every step, read a step later so nobody waits)."""
    if not ctx.is_distributed:
        return lambda: value
    group, device = _host_side(ctx, None)
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    work = dist.all_reduce(tensor, op=op, group=group, async_op=True)

    def result() -> int:
        work.wait()
        return int(tensor.item())

    return result


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op without a process group)."""
    if ctx.is_distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def teardown(ctx: DistContext) -> None:
    """Destroy the process group if :func:`init_distributed` created it (the captured
    sharded lookups, whose graphs hold its collectives, are dropped first)."""
    if ctx.owns_group and dist.is_initialized():
        from hashrec.distributed.sharded_graphs import release_graphs

        release_graphs()
        # Every rank finishes its collectives before any tears its connections down:
        # gloo aborts a rank whose peer closed the group under a pending operation.
        if ctx.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()

"""Memory budgets of one rank for the planner: detected, or set by flags / environment.

``HASHREC_GPU_MEMORY_BYTES`` and ``HASHREC_HOST_MEMORY_BYTES`` (plain integers,
bytes per rank) override detection. Detection takes the free GPU memory of the
rank's device (``torch.cuda.mem_get_info``) and the host's physical memory
divided among the ranks on the host (``LOCAL_WORLD_SIZE``), each times a
headroom fraction that leaves room for the dense model, activations and data
loading. Without CUDA (a rank computing on the CPU) both tiers of a table live in host
memory whatever the mode: the planner then fits their bytes together within the host
budget (``Topology.shared_memory``), and the "GPU" budget, the host budget unless set,
bounds the device tier alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

GPU_MEMORY_ENV = "HASHREC_GPU_MEMORY_BYTES"
HOST_MEMORY_ENV = "HASHREC_HOST_MEMORY_BYTES"


@dataclass(frozen=True)
class Topology:
    """What one rank may spend on dynamic-table storage (all ranks are alike).

    Attributes:
        gpu_bytes: GPU memory budget per rank.
        host_bytes: host memory budget per rank.
        world_size: number of ranks (for the printed plan).
        shared_memory: the "GPU" tier is host memory too (no CUDA device): a plan's GPU
            and host bytes together must fit ``host_bytes``, its GPU bytes ``gpu_bytes``.
    """

    gpu_bytes: int
    host_bytes: int
    world_size: int = 1
    shared_memory: bool = False

    def __post_init__(self) -> None:
        for name in ("gpu_bytes", "host_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} is not valid; allowed: an int >= 0")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) \
                or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r} is not valid; allowed: an int >= 1")
        if not isinstance(self.shared_memory, bool):
            raise ValueError(f"shared_memory={self.shared_memory!r} is not valid; allowed: a "
                             f"bool")


def _env_bytes(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not valid; allowed: an integer number of bytes") \
            from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} is not valid; allowed: an integer >= 0")
    return value


def host_memory_per_rank(env: Mapping[str, str] | None = None) -> int:
    """Physical host memory divided by the ranks on this host (``LOCAL_WORLD_SIZE``)."""
    env = os.environ if env is None else env
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local_ranks = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    return total // local_ranks


def detect_topology(world_size: int = 1, device: torch.device | str | None = None,
                    gpu_bytes: int | None = None, host_bytes: int | None = None,
                    gpu_headroom: float = 0.8, host_headroom: float = 0.5,
                    env: Mapping[str, str] | None = None) -> Topology:
    """Budgets of this rank: explicit arguments, else environment, else detection.

    Args:
        world_size: ranks in the job.
        device: the rank's device; CUDA devices are measured with ``mem_get_info``. Any
            other (default: the CPU) gives a ``shared_memory`` topology whose GPU budget
            defaults to the host budget.
        gpu_bytes: explicit GPU budget (a command-line flag), bytes per rank.
        host_bytes: explicit host budget, bytes per rank.
        gpu_headroom: share of the free GPU memory given to dynamic tables.
        host_headroom: share of the rank's host memory given to dynamic tables.
        env: environment to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
    for name, value in (("gpu_headroom", gpu_headroom), ("host_headroom", host_headroom)):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name}={value!r} is not valid; allowed: (0, 1]")
    if host_bytes is None:
        host_bytes = _env_bytes(env, HOST_MEMORY_ENV)
    if host_bytes is None:
        host_bytes = int(host_memory_per_rank(env) * host_headroom)
    device = torch.device("cpu" if device is None else device)
    if gpu_bytes is None:
        gpu_bytes = _env_bytes(env, GPU_MEMORY_ENV)
    if gpu_bytes is None:
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            gpu_bytes = int(free * gpu_headroom)
        else:
            gpu_bytes = host_bytes
    return Topology(gpu_bytes=gpu_bytes, host_bytes=host_bytes, world_size=world_size,
                    shared_memory=device.type != "cuda")

"""Spawn a small gloo world on CPU and run named scenarios on every rank.

Scenario functions run inside the workers; they receive the rank's DistContext
and return picklable results, gathered per scenario and rank by the parent.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

from hashrec.distributed.process_group import init_distributed, teardown


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, scenarios: dict[str, Callable],
            out_dir: str, env: dict[str, str] | None = None, cuda: bool = False) -> None:
    os.environ.update(env or {})
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels will be interpreted
        import interpreter_patch_once
        interpreter_patch_once.install()
        import compile_check  # their launches go to the compile check's log, where set

        compile_check.install_launch_log()

    def phase(name: str) -> None:  # this rank's last phase, read if it dies natively
        with open(_phase_path(out_dir, rank), "w", encoding="utf-8") as f:
            f.write(name)

    # Generous: on CPU the ranks share the cores with the other test workers.
    ctx = init_distributed(use_cuda=cuda, timeout_s=180)
    results = {}
    try:
        for name, scenario in scenarios.items():
            phase(f"scenario {name}")
            try:
                results[name] = scenario(ctx)
            except Exception:  # noqa: BLE001 - reported to the parent test
                results[name] = RuntimeError(traceback.format_exc())
                break  # the peers may now be stuck in a collective: stop here
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        phase("teardown")
        teardown(ctx)
        phase("exit")


def _phase_path(out_dir: str, rank: int) -> str:
    """Where a rank keeps its last phase (a scenario, the teardown, the interpreter's exit),
    which the parent reads when a rank dies without an exception (a native abort)."""
    return os.path.join(out_dir, f"rank{rank}.phase")


def _last_phases(out_dir: str, world_size: int) -> str:
    phases = []
    for r in range(world_size):
        try:
            with open(_phase_path(out_dir, r), encoding="utf-8") as f:
                phases.append(f"rank {r}: {f.read()}")
        except OSError:
            phases.append(f"rank {r}: before its first scenario")
    return "; ".join(phases)


def run_world(scenarios: dict[str, Callable], world_size: int, out_dir: str,
              env: dict[str, str] | None = None, cuda: bool = False) -> dict[str, list]:
    """Run every scenario on ``world_size`` gloo ranks; returns name -> per-rank results.
    ``env``: environment variables the ranks set before anything else (this process's
    own environment is left alone). ``cuda``: rank r computes on cuda:r over NCCL."""
    try:
        mp.spawn(_worker, args=(world_size, free_port(), scenarios, str(out_dir), env, cuda),
                 nprocs=world_size, join=True)
    except mp.ProcessExitedException as err:  # a native abort: say where each rank was
        raise RuntimeError(f"{err}; last phases: {_last_phases(str(out_dir), world_size)}") \
            from err
    per_rank = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
    return {name: [results.get(name) for results in per_rank] for name in scenarios}

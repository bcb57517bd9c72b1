"""Rank, world size and collective helpers that also work without torch.distributed."""

from __future__ import annotations

import torch
import torch.distributed as dist


def rank_and_world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, or (0, 1) when not initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Waits for every rank; a no-op in a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank_failed(failed: bool) -> bool:
    """True on every rank if ``failed`` is true on any rank (collective when distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return failed
    flag = torch.tensor([1 if failed else 0], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def gather_counts(counts: list[int]) -> list[list[int]]:
    """All-gathers a fixed-length list of ints: result[rank] is that rank's list."""
    if not (dist.is_available() and dist.is_initialized()) or not counts:
        return [list(counts)] * (dist.get_world_size() if dist.is_initialized() else 1)
    local = torch.tensor(counts, dtype=torch.int64, device=_collective_device())
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [t.cpu().tolist() for t in out]


def gather_objects(obj):
    """All-gathers a picklable object: result[rank] is that rank's (one process: [obj])."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_on_rank_zero(fn, what: str, error_type: type[Exception]):
    """Runs ``fn()`` on rank 0 alone and gives its (picklable) result to every rank.

    For a decision all ranks must share, such as which checkpoint of a model_dir is the
    latest: ranks looking on their own, at slightly different moments, could decide
    differently while another run writes there. An error raised on rank 0 is raised on
    every rank (as itself on rank 0, as ``error_type`` with its message on the others),
    so that none waits for a result that never comes.

    Args:
        fn: the work; its result is returned on every rank.
        what: names the work in the error raised on the other ranks.
        error_type: exception class raised on the other ranks (the subsystem's error base).
    """
    rank, world_size = rank_and_world()
    if world_size == 1:
        return fn()
    error: BaseException | None = None
    reply: tuple = (None, None)
    if rank == 0:
        try:
            reply = (fn(), None)
        except Exception as e:  # noqa: BLE001 - re-raised below on every rank
            error = e
            reply = (None, str(e) if isinstance(e, error_type)
                     else f"{what} failed on rank 0: {e}")
    box = [reply]
    dist.broadcast_object_list(box, src=0, device=_collective_device())
    if error is not None:
        raise error
    result, message = box[0]
    if message is not None:
        raise error_type(message)
    return result


def run_on_all_ranks(fn, what: str, error_type: type[Exception]):
    """Runs ``fn()`` on this rank and raises on every rank if it failed on any.

    Keeps ranks from hanging in a later collective when one of them raised.

    Args:
        fn: the local work; its result is returned.
        what: names the work in the error raised on ranks that did not fail themselves.
        error_type: exception class raised (the subsystem's error base).
    """
    error: BaseException | None = None
    result = None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - re-raised below on every rank
        error = e
    if any_rank_failed(error is not None):
        if error is None:
            raise error_type(f"{what} failed on another rank; see that rank's log")
        if isinstance(error, error_type):
            raise error
        raise error_type(f"{what} failed: {error}") from error
    return result

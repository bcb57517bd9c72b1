"""Whether an all-to-all can live in a CUDA graph, and what it then costs the host.

A sharded training step issues three variable-size all-to-alls per step from the
host (keys, rows, gradients), each costing the host about 0.15 ms, between short
kernel sequences that are host-bound too. Capturing the exchange in a CUDA graph
needs fixed sizes (every peer's part padded to one capacity). This checks, under
torchrun on NCCL, that ``all_to_all_single`` with equal splits can be captured,
that replays deliver the right rows, and times the host per exchange: eager
against one replay.

Usage::

    torchrun --nproc_per_node 2 benchmarks/graph_collectives.py --out benchmarks/results/graph_collectives_gpu
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import environment, write_results  # noqa: E402


def _exchange(send: torch.Tensor, recv: torch.Tensor, rounds: int) -> None:
    """``rounds`` all-to-alls with an elementwise step between (a kernel's worth)."""
    for _ in range(rounds):
        dist.all_to_all_single(recv, send)
        send.copy_(recv).add_(1)


def _host_ms(fn, calls: int) -> tuple[float, float]:
    """(host ms per call while issuing, wall ms per call until the device is done)."""
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (issued - start) / calls * 1e3, (done - start) / calls * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1 << 15, help="rows per peer")
    p.add_argument("--width", type=int, default=33)
    p.add_argument("--rounds", type=int, default=3, help="exchanges per call")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    shape = (world * args.rows, args.width)
    send = torch.full(shape, float(rank), device=device)
    recv = torch.empty_like(send)
    _exchange(send, recv, 1)  # the communicator exists before any capture
    torch.cuda.synchronize()
    eager_host, eager_wall = _host_ms(lambda: _exchange(send, recv, args.rounds), args.calls)
    result = {"rows_per_peer": args.rows, "width": args.width, "rounds": args.rounds,
              "calls": args.calls, "world": world, "eager_host_ms": eager_host,
              "eager_wall_ms": eager_wall}
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _exchange(send, recv, 1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            _exchange(send, recv, args.rounds)
        # Check a replay: after it every row of peer r's part came from rank r.
        send.copy_(torch.full_like(send, float(rank)))
        # Each round adds 1 after exchanging, and an exchange swaps whose rank a value
        # names: after an odd number of rounds peer r's part holds r + rounds - 1, after
        # an even number every part holds this rank's + rounds - 1.
        names = [float(r) for r in range(world)] if args.rounds % 2 else [float(rank)] * world
        expected = recv.new_tensor(names).repeat_interleave(args.rows)[:, None].expand(shape)
        graph.replay()
        torch.cuda.synchronize()
        ok = bool(torch.equal(recv, expected + (args.rounds - 1)))
        graph_host, graph_wall = _host_ms(graph.replay, args.calls)
        result.update(captured=True, replay_correct=ok, graph_host_ms=graph_host,
                      graph_wall_ms=graph_wall)
    except Exception as error:  # noqa: BLE001 - the finding is whether it works
        result.update(captured=False, error=repr(error))
    if rank == 0:
        print(result, flush=True)
        if args.out:
            lines = ["# All-to-all in a CUDA graph (NCCL)", "",
                     ", ".join(f"{k} {v}" for k, v in sorted(environment().items())), "",
                     f"Command: `torchrun --nproc_per_node {world} benchmarks/graph_collectives.py "
                     f"{' '.join(argv or sys.argv[1:])}`", "",
                     f"{args.rounds} all_to_all_single of {args.rows} rows x {args.width} float32 "
                     f"per peer, each followed by a copy and an add, per call; {args.calls} calls.",
                     ""]
            if result["captured"]:
                lines += ["| path | host ms per call | wall ms per call |", "|---|---:|---:|",
                          f"| eager | {eager_host:.4f} | {eager_wall:.4f} |",
                          f"| one graph replay | {result['graph_host_ms']:.4f} | "
                          f"{result['graph_wall_ms']:.4f} |", "",
                          f"Replay delivered the expected rows: {result['replay_correct']}."]
            else:
                lines += [f"Capture failed: `{result['error']}`; eager host ms per call "
                          f"{eager_host:.4f}."]
            write_results(args.out, result, "\n".join(lines) + "\n")
    # A live graph holding NCCL's kernels kept the group's destruction waiting (both runs
    # of the first version of this script hung here): drop it first.
    if result.get("captured"):
        graph.reset()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A sharded table's training lookup at fixed sizes, captured with its exchanges.

Under several ranks the training lookup of a dynamic table is a chain of short
steps issued from Python: route the keys to their owners, exchange them, find
repeats across senders, look up, reply, exchange the rows back, put them in
order. Every size in that chain changes from step to step, so each step is
launched eagerly, and a sharded training step costs the host some 2 ms more than
one GPU's (``benchmarks/results/train_scaling.md``).

``ShardedGraphs`` pads the chain to one capacity C per peer that every rank
knows (the largest number of keys any rank sends any rank this step, rounded up
to a size class: ``hashrec.table.lookup_graphs.padded_size``), so that every size
in it is fixed by C: each rank sends every peer C rows (its keys first, then rows
whose count is 0), the owners look up W x C rows of which only the first occurrence
of each real key is active, and the replies come back in the same places. The chain
of one capacity is captured once as a CUDA graph, NCCL's all-to-alls included
(``benchmarks/results/graph_collectives_gpu.md``), and replayed: the keys, their
tags and counts and four scalars are copied in, one replay, the rows copied out.
The backward sends the gradients in the same padded layout; for a captured lookup
that exchange is captured too, with the gradients riding along it
(``hashrec.distributed.ride``: the small dense tables' and the dense network's,
packed and unpacked in the graph), and the optimizer step runs after its replay.

Whether a rank replays a graph or runs the padded chain uncaptured (its first
lookups of a capacity, a shard that may still grow, a failed capture) is its own
choice: both issue the same two exchanges of the same sizes, so the ranks stay
matched. A capture runs nothing (the kernels were compiled by the uncaptured runs).

What the owners do is what the eager chain does: the same keys, summed counts and
gradients reach each table, in another order (a new row's random initial value
depends on its position among the owner's keys: initializers with ``key_seed``,
or constant ones, give the same values either way). On CPU (or with
``capture=False``) the padded chain runs eagerly: what the tests check.

It is on by default where it can be captured (``sharded_graphs_enabled``); it took 2
ranks on 2 H200s from 1.34 to 1.66 M samples/s
(``benchmarks/results/ab_gpu_x2_sharded_graphs.md``). ``HASHREC_SHARDED_GRAPHS=0``
turns it off, ``=1`` turns it on everywhere (uncaptured where it cannot be captured).
"""

from __future__ import annotations

import collections
import logging
import os
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hashrec.distributed.ops.merge import first_in_runs
from hashrec.distributed.ops.reply import pack_reply
from hashrec.distributed.ride import Ride, RideBuffers, RideResult
from hashrec.distributed.side_exchange import order_after_side, settle_side
from hashrec.table.hashing import owner_of
from hashrec.table.options import ScoreStrategy
from hashrec.table.validation import input_checks_forced

logger = logging.getLogger("hashrec.distributed")

MAX_GRAPHS = 4  # capacities kept, the least recently used dropped
MAX_CAPTURES = 16  # captures per table: capacities that keep displacing each other stop
CAPTURE_AFTER = 2  # lookups of a capacity before it is captured
# Padding rows of the owners' repeat search sort after every real (tag, key).
_PAD_KEY = torch.iinfo(torch.int64).max
_PAD_TAG = torch.iinfo(torch.int32).max


# Every ShardedGraphs alive, for release_graphs.
_LIVE: weakref.WeakSet = weakref.WeakSet()


def release_graphs() -> None:
    """Drops every captured chain of this process. Call it before destroying the process
    group their exchanges run on: a live graph that holds NCCL's kernels kept the
    group's destruction (and the process's exit) waiting on the H200s."""
    for graphs in list(_LIVE):
        graphs.release()


def sharded_graphs_enabled(table) -> bool:
    """Whether ``table``'s sharded training lookup takes the padded chain: by default
    where it can be captured (a CUDA table whose rows all live in GPU memory, looked up
    on the fixed-size path); ``HASHREC_SHARDED_GRAPHS=0`` never, ``=1`` always (on CPU,
    or a table with rows in host memory, it then runs uncaptured: padding and nothing
    gained)."""
    setting = os.environ.get("HASHREC_SHARDED_GRAPHS", "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"HASHREC_SHARDED_GRAPHS={setting!r}: expected 0 or 1")
    if setting:
        return setting == "1"
    return _capturable(table.device) and table._fixed_path()


def _capturable(device: torch.device) -> bool:
    return (device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
            and not input_checks_forced())


class _Chain:
    """One capacity's buffers, graph and outputs."""

    __slots__ = ("capacity", "keys", "tags", "counts", "scalars", "bounds", "graph", "out",
                 "clocked", "backward")

    def __init__(self, capacity: int, world: int, device: torch.device, tagged: bool,
                 clocked: bool) -> None:
        size = capacity * world
        self.capacity = capacity
        self.keys = torch.zeros(size, dtype=torch.int64, device=device)
        self.tags = torch.zeros(size, dtype=torch.int32, device=device) if tagged else None
        self.counts = torch.ones(size, dtype=torch.int64, device=device)
        # n (this rank's keys), the missing and new rows' seeds, the clock.
        self.scalars = torch.zeros(4, dtype=torch.int64, device=device)
        self.bounds = torch.arange(world + 1, dtype=torch.int64, device=device) * capacity
        self.clocked = clocked
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: dict | None = None
        self.backward: dict[tuple, _Backward] = {}  # by (dim, ride layout, scale)


class _Backward:
    """One gradient exchange of a chain (a row width, a ride's layout): its input
    buffers, graph and outputs."""

    __slots__ = ("grads", "ride", "graph", "out", "seen")

    def __init__(self, size: int, dim: int, ride: Ride | None, device: torch.device) -> None:
        self.grads = torch.zeros(size, dim, dtype=torch.float32, device=device)
        self.ride = RideBuffers(ride, device) if ride is not None else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple | None = None
        self.seen = 0


@dataclass(frozen=True)
class PaddedState:
    """What a padded lookup leaves for its gradient step (views of its chain's outputs:
    valid until the next lookup of that table).

    Attributes:
        chain: the capacity's buffers. n: the caller's keys.
        perm: (P,) caller position of each row sorted by owner (P = world x capacity).
        dest: (P,) each sorted row's place in the padded exchange (P: not sent).
        rep: (P,) first occurrence of each received row's key. slots: (P,) owner slots
            (-1: inactive or not stored). lr: learning rate of the gradient step.
    """

    chain: _Chain
    n: int
    perm: torch.Tensor
    dest: torch.Tensor
    rep: torch.Tensor
    slots: torch.Tensor
    lr: float | None


class ShardedGraphs:
    """The padded training lookup of one ``ShardedTable`` (module docstring)."""

    def __init__(self, sharded, capture: bool | None = None) -> None:
        self.sharded = sharded
        table = sharded.table
        self._capture = _capturable(table.device) if capture is None else capture
        self._chains: collections.OrderedDict[tuple, _Chain] = collections.OrderedDict()
        self._seen: collections.Counter[tuple] = collections.Counter()
        self._failed = False
        self._owner: tuple | None = None
        self.captures = 0
        self.replays = 0
        self.lookups = 0  # lookups served by the padded chain, replayed or not
        self._said = False  # whether a fall-back to the eager exchanges was logged
        _LIVE.add(self)

    def release(self) -> None:
        """Drops the captured chains (later lookups capture again)."""
        for chain in self._chains.values():
            for entry in chain.backward.values():
                if entry.graph is not None:
                    entry.graph.reset()
            chain.backward.clear()
            if chain.graph is not None:
                chain.graph.reset()
            chain.graph, chain.out = None, None
        self._chains.clear()
        self._seen.clear()

    def _check_owner(self) -> None:
        """Drops every graph when the table's storage (or counter, or state row) is new
        (a restore): the graphs read and write the old one's tensors."""
        from hashrec.table.lookup_graphs import table_identity

        owner = table_identity(self.sharded.table)
        if owner != self._owner:
            self._chains.clear()
            self._seen.clear()
            self._owner = owner
            self.captures = 0

    # -- forward -------------------------------------------------------------------
    def fits(self, pair_max: int) -> bool:
        """Whether a lookup whose largest pair count is ``pair_max`` takes the padded
        chain: its W x capacity rows within ``MAX_KEYS``, and scores the table keeps
        itself (CUSTOMIZED scores come from the caller: the eager chain says so). The
        same on every rank."""
        options = self.sharded.table.options
        if options.score_strategy is ScoreStrategy.CUSTOMIZED:
            self._say_once("its caller gives the scores (CUSTOMIZED), which the eager "
                           "exchanges ask for")
            return False
        from hashrec.table.lookup_graphs import MAX_KEYS, padded_size  # imports kernels

        rows = padded_size(max(pair_max, 1)) * self.sharded.world_size
        if rows > MAX_KEYS:
            self._say_once(f"{rows} padded rows ({pair_max} keys to one peer) exceed its "
                           f"{MAX_KEYS}")
        return rows <= MAX_KEYS

    def _say_once(self, why: str) -> None:
        """Logs, once per table, why a lookup took the eager exchanges."""
        if not self._said:
            self._said = True
            logger.info("table %r: a training lookup takes the eager exchanges, not the "
                        "padded chain: %s (said once)", self.sharded.table.options.name, why)

    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None, counts: torch.Tensor,
               pair_max: int, lr: float | None):
        """Rows of this rank's unique keys (a collective; the caller checked :meth:`fits`).
        Returns a ``ShardedLookupResult`` whose state is a :class:`PaddedState`.

        Whether a rank replays a graph or runs the chain uncaptured is its own choice
        (its shard may still grow, its capture may fail): both issue the same two
        exchanges of the same sizes, so the ranks stay matched."""
        from hashrec.distributed.sharded_lookup import ShardedLookupResult
        from hashrec.table.lookup_graphs import padded_size

        world = self.sharded.world_size
        capacity = padded_size(max(pair_max, 1))
        table = self.sharded.table
        clocked = table.options.score_strategy not in (ScoreStrategy.LFU,
                                                       ScoreStrategy.CUSTOMIZED)
        key = (capacity, tags is not None, clocked)
        self._check_owner()
        chain = self._chains.get(key)
        if chain is not None:
            self._chains.move_to_end(key)
        else:
            chain = _Chain(capacity, world, keys.device, tags is not None, clocked)
            if self._may_capture(key, capacity * world):
                self._build(chain)
                if chain.graph is not None:
                    self._chains[key] = chain
                    while len(self._chains) > MAX_GRAPHS:
                        self._chains.popitem(last=False)
        out = self._run(chain, keys, tags, counts)
        self.lookups += 1
        n = keys.numel()
        state = PaddedState(chain, n, out["perm"], out["dest"], out["rep"], out["slots"], lr)
        return ShardedLookupResult(values=out["values"][:n].clone(), state=state,
                                   stored=out["stored"][:n].clone())

    def _graph_mode(self) -> bool:
        """Whether the owners look up through the table's fixed-size training path (the
        one a graph can hold; the same on every rank: device and storage mode), else
        through ``table.lookup`` (the CPU path)."""
        return self.sharded.table._fixed_path()

    def _may_capture(self, key: tuple, size: int) -> bool:
        """Whether to capture this capacity now: a table that no longer grows, whose
        initial values the kernel computes itself, captures left, and this capacity
        run uncaptured on the full table before (which compiled its kernels: a capture
        runs nothing, so it warms nothing up)."""
        from hashrec.table.ops.insert.finish import in_kernel

        if not (self._capture and self._graph_mode()) or self._failed:
            return False
        table = self.sharded.table
        if table.storage.num_buckets < table._max_buckets or not all(
                in_kernel(args, size, table.dim)
                for args in (table._train_missing_args(), table._initializer)):
            return False
        self._seen[key] += 1
        return self._seen[key] >= CAPTURE_AFTER and self.captures < MAX_CAPTURES

    def _run(self, chain: _Chain, keys: torch.Tensor, tags: torch.Tensor | None,
             counts: torch.Tensor) -> dict:
        """Feeds the chain this step's keys and runs it (a replay once captured)."""
        from hashrec.table.ops.insert.finish import draws_seed

        table, n = self.sharded.table, keys.numel()
        graph_mode = self._graph_mode()
        chain.keys[:n].copy_(keys)
        if chain.tags is not None:
            chain.tags[:n].copy_(tags)
        chain.counts[:n].copy_(counts)
        scalars = [n, 0, 0, 0]
        if graph_mode:  # seeds drawn as the eager lookup draws them, then the clock
            size = chain.keys.numel()
            scalars[1:3] = [table._kernel_seed() if draws_seed(args, size, table.dim) else 0
                            for args in (table._train_missing_args(), table._initializer)]
            scalars[3] = table._clock() if chain.clocked else 0
            table._rows.begin_batch()
        chain.scalars.copy_(torch.tensor(scalars), non_blocking=True)
        if chain.graph is None:
            out = self._core(chain, eager=not graph_mode)
        else:
            self.replays += 1
            order_after_side(keys.device)
            chain.graph.replay()
            out = chain.out
        if graph_mode:  # the counters went to the table's device totals; ERROR reads now
            table._report_refused_fixed(out["refused"])
        return out

    def _build(self, chain: _Chain) -> None:
        """Captures ``chain``. Nothing runs while capturing (no exchange either): the
        kernels were compiled by the uncaptured runs of this capacity before."""
        table = self.sharded.table
        try:
            chain.graph, chain.out = self._captured(lambda: self._core(chain, eager=False))
            self.captures += 1
            logger.info("table %r: captured its sharded training lookup of %d keys per peer "
                        "as a CUDA graph", table.options.name, chain.capacity)
        except Exception as error:  # noqa: BLE001 - any failure: run uncaptured
            self._failed = True
            chain.graph = None
            logger.warning("table %r: capturing its sharded training lookup failed (%s); it "
                           "runs uncaptured", table.options.name, error)

    def _core(self, chain: _Chain, eager: bool) -> dict:
        """The padded chain on the chain's buffers (what a graph captures)."""
        world, capacity = self.sharded.world_size, chain.capacity
        size = world * capacity
        device = chain.keys.device
        positions = torch.arange(size, device=device)
        valid = positions < chain.scalars[0]
        # Route: rows sorted by owner (stable: each owner's keys stay sorted), each owner's
        # run placed at owner x capacity; padding rows go to a spare row past the end.
        owner = torch.where(valid, owner_of(chain.keys, world), world)
        sorted_owner, perm = torch.sort(owner, stable=True)
        per_owner = torch.zeros(world + 1, dtype=torch.int64, device=device).index_add_(
            0, owner, torch.ones_like(owner))
        starts = torch.cumsum(per_owner, 0) - per_owner
        dest = torch.where(sorted_owner < world,
                           sorted_owner * capacity + positions - starts[sorted_owner], size)
        tags = chain.tags.to(torch.int64) if chain.tags is not None else torch.zeros_like(
            chain.keys)
        columns = torch.stack([chain.keys, tags, chain.counts], 1)[perm]
        send = torch.zeros(size + 1, 3, dtype=torch.int64, device=device).index_copy_(
            0, dest, columns)[:size]
        received = self._exchange(send)
        reply, rep, slots, extra = self._serve(chain, received, eager)
        rows = self._exchange(reply)
        # Each sent row's reply came back to its place: back to the caller's order.
        spare = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        answered = torch.empty_like(rows).index_copy_(0, perm, spare[dest])
        return {"values": answered[:, :-1].contiguous(), "stored": answered[:, -1] > 0.5,
                "perm": perm, "dest": dest, "rep": rep, "slots": slots, **extra}

    def _serve(self, chain: _Chain, received: torch.Tensor, eager: bool) -> tuple:
        """Owner side: (reply (P, dim + 1), rep (P,), slots (P,), the captured lookup's
        statistics). A received row with count 0 is padding."""
        keys, tags, counts = (column.contiguous() for column in received.unbind(1))
        valid = counts > 0
        # Each sender's run is sorted by (tag, key) with its padding last.
        rep, first = first_in_runs(torch.where(valid, keys, _PAD_KEY),
                                   torch.where(valid, tags, _PAD_TAG).to(torch.int32),
                                   [chain.capacity] * self.sharded.world_size, chain.bounds)
        active = first & valid
        summed = torch.zeros_like(counts).index_add_(0, rep, counts)
        table = self.sharded.table
        own_tags = tags.to(torch.int32) if chain.tags is not None else None
        if eager:
            result = table.lookup(keys, own_tags, train=True, counts=summed, active=active)
            return pack_reply(result.values, result.slots, rep), rep, result.slots, {}
        given = chain.scalars[3:].expand(keys.numel()).contiguous() if chain.clocked else None
        slots, values, counted, refused = table._train_fixed(
            keys, own_tags, summed, given, active, seeds=chain.scalars[1:3])
        refused = table._count_in_place(counted, refused)
        return pack_reply(values, slots, rep), rep, slots, {"refused": refused}

    def _exchange(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor)
        dist.all_to_all_single(out, tensor, group=self.sharded.group)
        return out

    # -- backward ------------------------------------------------------------------
    def apply_gradients(self, state: PaddedState, grads: torch.Tensor, scale: float,
                        ride: Ride | None = None) -> RideResult | None:
        """Sends each key's gradient to its owner in the lookup's padded layout, sums it
        there per key and applies the optimizer (a collective). ``ride`` travels to
        every rank too; returns its sums over ranks times ``scale`` (tensors valid until
        this chain's next backward of the same layout), or None.

        For a captured lookup the exchange, the sums and the ride's packing and
        unpacking are captured too (from its second backward of one row width and ride
        layout on); the optimizer step, which reads the learning rate and step on the
        host, runs after the replay."""
        chain = state.chain
        key = (grads.shape[1], None if ride is None else ride.layout(), scale)
        entry = chain.backward.get(key)
        if entry is None:
            entry = chain.backward[key] = _Backward(chain.keys.numel(), key[0], ride,
                                                    grads.device)
        entry.grads[:state.n].copy_(grads)
        if entry.ride is not None:
            entry.ride.load(ride)
        if entry.graph is None and chain.graph is not None and entry.seen and not self._failed:
            self._capture_backward(state, entry, scale)
        entry.seen += 1
        if entry.graph is not None:
            order_after_side(grads.device)
            entry.graph.replay()
            summed, carried = entry.out
        else:
            summed, carried = self._exchange_gradients(state, entry, scale)
        self.sharded.table.apply_gradients(state.slots, summed, lr=state.lr)
        return carried

    def _exchange_gradients(self, state: PaddedState, entry: _Backward, scale: float
                            ) -> tuple[torch.Tensor, RideResult | None]:
        """(gradients summed per received row (P, dim), the ride's sums over ranks or
        None) from the entry's buffers (what a graph captures). Rows past the caller's
        keys in ``entry.grads`` are never sent: their sorted rows go to the spare row."""
        world, capacity = self.sharded.world_size, state.chain.capacity
        size, dim = world * capacity, entry.grads.shape[1]
        send = entry.grads.new_zeros(size + 1, dim).index_copy_(
            0, state.dest, entry.grads[state.perm])
        payload = send[:size].view(world, capacity * dim)
        if entry.ride is not None:
            payload = torch.cat([payload, entry.ride.pack().view(1, -1).expand(world, -1)], 1)
        with self.sharded.timer.region():
            received = self._exchange(payload.contiguous())
        if scale != 1.0:
            received.mul_(scale)
        summed = torch.zeros(size, dim, dtype=torch.float32, device=send.device).index_add_(
            0, state.rep, received[:, :capacity * dim].reshape(size, dim))
        if entry.ride is None:
            return summed, None
        return summed, entry.ride.unpack(received[:, capacity * dim:].sum(0))

    def _captured(self, run) -> tuple:
        """``capture_graph`` of ``run`` on the table's GPU, once no side collective is in
        flight (two collectives of one communicator never run together)."""
        from hashrec.table.lookup_graphs import capture_graph

        device = self.sharded.table.device
        settle_side(device)
        return capture_graph(device, run)

    def _capture_backward(self, state: PaddedState, entry: _Backward, scale: float) -> None:
        """Captures the gradient exchange of a captured lookup (runs nothing)."""
        table = self.sharded.table
        try:
            entry.graph, entry.out = self._captured(
                lambda: self._exchange_gradients(state, entry, scale))
        except Exception as error:  # noqa: BLE001 - any failure: run uncaptured
            self._failed = True
            entry.graph, entry.out = None, None
            logger.warning("table %r: capturing its sharded gradient exchange failed (%s); "
                           "it runs uncaptured", table.options.name, error)

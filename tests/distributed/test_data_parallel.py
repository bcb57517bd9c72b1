"""The replicated gradient exchanges on 2 gloo ranks: the dense network's (flat buffer or
gradients apart) and the replicated tables' (sums per row, sizes on the host - sparse
gather, with the sizes exchanged or given - or none: dense all-reduce)."""

from __future__ import annotations

import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import (
    FlatGradients,
    all_reduce_gradients,
    all_reduce_row_gradients_many,
    gather_sparse_gradients_many,
)

WORLD = 2


def _local(rank: int, table: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s unique rows of table ``table`` and their gradients (table 1 of
    rank 1 is empty)."""
    g = torch.Generator().manual_seed(10 * rank + table)
    count = 0 if (rank, table) == (1, 1) else 6 + 3 * rank
    rows = torch.randperm(12, generator=g)[:count]
    return rows, torch.randn(count, 2 + table, generator=g)


def _want(t: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Table t's distinct rows, its gradients summed over ranks (all 12 rows) and the
    pairs all ranks sent."""
    parts = [_local(r, t) for r in range(WORLD)]
    want = torch.zeros(12, 2 + t)
    for part_rows, part_grads in parts:  # rank order, as the exchange sums
        want.index_add_(0, part_rows, part_grads)
    return torch.unique(torch.cat([p[0] for p in parts])), want, \
        sum(p[0].numel() for p in parts)


def scenario_gather(ctx, sizes=None):
    tables = [_local(ctx.rank, t) for t in range(2)]
    out = gather_sparse_gradients_many(tables, ctx, sizes=sizes,
                                       extra=torch.full((3,), ctx.rank + 1.0))
    out, extra = out[:-1], out[-1]  # the extra buffer, summed over ranks in the gather
    alone = gather_sparse_gradients_many([], ctx, extra=torch.full((2,), ctx.rank + 0.5))
    checks = [torch.equal(extra, torch.full((3,), 3.0)) and len(alone) == 1
              and torch.equal(alone[0], torch.full((2,), 2.0))]
    for t, (rows, grads) in enumerate(out):
        want_rows, want, sent = _want(t)
        kept = rows >= 0
        checks.append(rows.numel() == sent and bool((rows[~kept] == -1).all())
                      and torch.equal(rows[kept], want_rows)
                      and torch.equal(grads[kept], want[want_rows])
                      and not grads[~kept].any())
    return checks


def test_gathered_gradients_are_summed_per_row_with_a_fill(tmp_path):
    results = run_world({"gather": scenario_gather}, WORLD, tmp_path)["gather"]
    for result in results:
        assert not isinstance(result, Exception), result
        assert result == [True, True, True]


def scenario_gather_given_sizes(ctx):
    sizes = [[_local(r, t)[0].numel() for t in range(2)] for r in range(WORLD)]
    return scenario_gather(ctx, sizes)


def scenario_wrong_sizes(ctx):
    sizes = [[_local(r, t)[0].numel() + 1 for t in range(2)] for r in range(WORLD)]
    try:
        gather_sparse_gradients_many([_local(ctx.rank, t) for t in range(2)], ctx, sizes=sizes)
    except Exception as exc:  # noqa: BLE001 - the message is the result
        return str(exc)
    return None


def scenario_all_reduce(ctx):
    out = all_reduce_row_gradients_many([(12,) + _local(ctx.rank, t) for t in range(2)], ctx,
                                        extra=torch.full((3,), ctx.rank + 1.0))
    out, extra = out[:-1], out[-1]  # the extra buffer, summed in the same all-reduce
    checks = []
    for t, (rows, grads) in enumerate(out):
        want_rows, want, _ = _want(t)
        touched = torch.zeros(12, dtype=torch.bool)
        touched[want_rows] = True
        checks.append(rows.shape == (12,) and torch.equal(rows[touched], want_rows)
                      and bool((rows[~touched] == -1).all())
                      and torch.allclose(grads, want) and not grads[~touched].any()
                      and torch.equal(extra, torch.full((3,), 3.0)))
    return checks


def test_given_sizes_skip_their_exchange_and_are_checked(tmp_path):
    results = run_world({"given": scenario_gather_given_sizes, "wrong": scenario_wrong_sizes},
                        WORLD, tmp_path)
    assert results["given"] == [[True, True, True]] * WORLD, results["given"]
    for message in results["wrong"]:
        assert "differ from the sizes shared ahead" in message, message


def test_small_tables_sum_their_gradients_in_one_all_reduce(tmp_path):
    results = run_world({"all_reduce": scenario_all_reduce}, WORLD, tmp_path)["all_reduce"]
    assert results == [[True, True]] * WORLD, results


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2),
                               torch.nn.Linear(2, 2))  # the last layer gets no gradient


def _backward(net: torch.nn.Module, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(100 * step + rank)
    net[:3](torch.randn(5, 4, generator=g)).square().sum().backward()


def scenario_flat_gradients(ctx):
    """Three steps: FlatGradients against all_reduce_gradients on the same gradients; in
    step 1 a gradient is replaced after zero() (it must be copied in)."""
    flat_net, apart_net = _net(), _net()
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    flat = FlatGradients(list(flat_net.parameters()) + [frozen], ctx)
    checks = []
    for step in range(3):
        flat.zero()
        _backward(flat_net, ctx.rank, step)
        if step == 1:  # a new tensor, not the buffer's view
            flat_net[0].weight.grad = flat_net[0].weight.grad * 2.0
        flat.all_reduce()
        for p in apart_net.parameters():
            p.grad = None
        _backward(apart_net, ctx.rank, step)
        if step == 1:
            apart_net[0].weight.grad = apart_net[0].weight.grad * 2.0
        all_reduce_gradients(list(apart_net.parameters()), ctx)
        pairs = list(zip(flat_net.parameters(), apart_net.parameters()))
        checks.append(all(torch.equal(a.grad, b.grad) for a, b in pairs)
                      and all(p.grad._base is flat.flat for p in flat_net.parameters())
                      and not flat_net[3].weight.grad.any()
                      and bool(flat_net[0].weight.grad.any()) and frozen.grad is None)
    return checks


def test_flat_gradients_average_like_gradients_apart(tmp_path):
    results = run_world({"flat": scenario_flat_gradients}, WORLD, tmp_path)["flat"]
    assert results == [[True, True, True]] * WORLD, results


def scenario_flat_gradients_changed_after_average(ctx):
    """A gradient accumulated into the buffer after another exchange averaged it (a
    parameter used before the embedding lookup) stops the step; none passes."""
    net = _net()
    flat = FlatGradients(list(net.parameters()), ctx)
    outcomes = []
    for late in (False, True):
        flat.zero()
        _backward(net, ctx.rank, 0)
        averaged = flat.ready().clone()
        flat.take_averaged(averaged)
        if late:
            net[0].bias.grad.add_(1.0)  # autograd adding a late gradient in place
        try:
            flat.all_reduce()
            outcomes.append("ok")
        except Exception as exc:  # noqa: BLE001 - the message is the result
            outcomes.append(str(exc))
    return outcomes


def test_a_gradient_changed_after_its_average_is_refused(tmp_path):
    results = run_world({"late": scenario_flat_gradients_changed_after_average}, WORLD,
                        tmp_path)["late"]
    for ok, late in results:
        assert ok == "ok"
        assert "changed after it was averaged" in late, late

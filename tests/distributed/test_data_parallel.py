"""The replicated tables' gradient exchange on 2 gloo ranks: sums per row, sizes on the host."""

from __future__ import annotations

import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import gather_sparse_gradients_many

WORLD = 2


def _local(rank: int, table: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s unique rows of table ``table`` and their gradients (table 1 of
    rank 1 is empty)."""
    g = torch.Generator().manual_seed(10 * rank + table)
    count = 0 if (rank, table) == (1, 1) else 6 + 3 * rank
    rows = torch.randperm(12, generator=g)[:count]
    return rows, torch.randn(count, 2 + table, generator=g)


def scenario_gather(ctx):
    tables = [_local(ctx.rank, t) for t in range(2)]
    out = gather_sparse_gradients_many(tables, ctx)
    checks = []
    for t, (rows, grads) in enumerate(out):
        parts = [_local(r, t) for r in range(WORLD)]
        sent = sum(p[0].numel() for p in parts)
        want_rows = torch.unique(torch.cat([p[0] for p in parts]))
        want = torch.zeros(12, 2 + t)
        for part_rows, part_grads in parts:  # rank order, as the exchange sums
            want.index_add_(0, part_rows, part_grads)
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
        assert result == [True, True]

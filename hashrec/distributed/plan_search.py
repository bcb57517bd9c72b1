"""Search of the storage planner: one variant per table, two budgets, least total cost.

This is a multiple-choice knapsack with two constraints (GPU and host bytes per
rank). Two heuristics produce candidate plans; the cheapest that fits wins:

* greedy upgrades: every table starts at its variant with the fewest GPU bytes;
  if the host budget is exceeded, tables shed host bytes for the fewest extra
  GPU bytes until it fits; then, while one fits, the upgrade with the largest
  cost reduction per byte (each resource relative to what is left of it) is taken.
* Lagrangian prices: each table independently picks the variant minimizing
  ``cost + a * gpu + b * host``; for a ladder of host prices ``b`` the smallest
  GPU price ``a`` that fits the GPU budget is bisected (GPU use falls as ``a``
  rises), and the same with the roles swapped. The cheapest feasible price
  points are then topped up with greedy upgrades.

The cheapest candidate is polished by pair exchanges: one table gives up
bytes (its cost rises) so that another can take them (its cost falls by more).
That repairs the tight-budget cases where single upgrades are all blocked.

All candidates are scored at once with numpy over a (tables, variants) grid
padded with +inf, so 100 tables x 20 variants plan in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_PRICE_LADDER = np.concatenate([[0.0], np.logspace(-4, 4, 33)])
_BISECT_STEPS = 48
_TOP_UP = 3
_PAIR_ROUNDS = 64
_PAIR_MOVES = 4096  # candidate single moves considered per side of a pair exchange


@dataclass
class Grid:
    """Variants of all tables as (tables, max_variants) float arrays, padded with +inf."""

    gpu: np.ndarray
    host: np.ndarray
    cost: np.ndarray

    @classmethod
    def build(cls, rows: list[list[tuple[float, float, float]]]) -> Grid:
        """rows[i] = [(gpu, host, cost) per variant of table i]."""
        width = max(len(r) for r in rows)
        shape = (len(rows), width)
        grid = cls(np.full(shape, np.inf), np.full(shape, np.inf), np.full(shape, np.inf))
        for i, row in enumerate(rows):
            grid.gpu[i, :len(row)], grid.host[i, :len(row)], grid.cost[i, :len(row)] = zip(*row)
        return grid

    def pick(self, choice: np.ndarray, array: np.ndarray) -> np.ndarray:
        """Per table, the entry of ``array`` at the chosen variant."""
        return array[np.arange(len(choice)), choice]

    def totals(self, choice: np.ndarray) -> tuple[float, float, float]:
        """(GPU bytes, host bytes, cost) of a choice."""
        return (float(self.pick(choice, self.gpu).sum()), float(self.pick(choice, self.host).sum()),
                float(self.pick(choice, self.cost).sum()))

    def fits(self, choice: np.ndarray, budget_gpu: float, budget_host: float) -> bool:
        gpu, host, _ = self.totals(choice)
        return gpu <= budget_gpu and host <= budget_host


def min_gpu_start(grid: Grid) -> np.ndarray:
    """Per table, the variant with the fewest GPU bytes (then host bytes, then cost)."""
    return np.lexsort((grid.cost, grid.host, grid.gpu), axis=1)[:, 0]


def _best_move(grid: Grid, gain: np.ndarray, spend: np.ndarray,
               allowed: np.ndarray) -> tuple[int, int] | None:
    """(table, variant) maximizing gain / spend among allowed moves, or None."""
    if not allowed.any():
        return None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = np.where(spend <= 0, np.inf, gain / np.where(spend <= 0, 1.0, spend))
        # Among free moves (no extra bytes) prefer the largest gain.
        score = np.where(np.isinf(ratio), np.finfo(float).max / 2 + gain, ratio)
    score = np.where(allowed, score, -np.inf)
    best = score.max()
    # Among (near) ties take the smallest step: it leaves room for the other tables.
    ties = allowed & (score >= best - 1e-9 * abs(best))
    return divmod(int(np.argmin(np.where(ties, spend, np.inf))), grid.gpu.shape[1])


def repair_host(grid: Grid, choice: np.ndarray, budget_gpu: float, budget_host: float) -> None:
    """Move tables to variants with fewer host bytes (in place) until the host budget fits."""
    while True:
        cur_gpu, cur_host = grid.pick(choice, grid.gpu), grid.pick(choice, grid.host)
        if cur_host.sum() <= budget_host:
            return
        shed = cur_host[:, None] - grid.host
        extra_gpu = grid.gpu - cur_gpu[:, None]
        allowed = (shed > 0) & (cur_gpu.sum() + extra_gpu <= budget_gpu)
        move = _best_move(grid, shed, extra_gpu, allowed)
        if move is None:
            return
        choice[move[0]] = move[1]


def top_up(grid: Grid, choice: np.ndarray, budget_gpu: float, budget_host: float) -> None:
    """Take, in place, the upgrade with the best cost reduction per byte while one fits.

    Bytes are weighed by what is left of each budget, so the scarcer resource counts more.
    Each upgrade strictly lowers one table's cost, so the loop ends.
    """
    while True:
        cur_gpu, cur_host = grid.pick(choice, grid.gpu), grid.pick(choice, grid.host)
        left_gpu, left_host = budget_gpu - cur_gpu.sum(), budget_host - cur_host.sum()
        d_gpu, d_host = grid.gpu - cur_gpu[:, None], grid.host - cur_host[:, None]
        gain = grid.pick(choice, grid.cost)[:, None] - grid.cost
        allowed = (gain > 0) & (d_gpu <= left_gpu) & (d_host <= left_host)
        spend = (np.maximum(d_gpu, 0) / max(left_gpu, 1.0)
                 + np.maximum(d_host, 0) / max(left_host, 1.0))
        move = _best_move(grid, gain, spend, allowed)
        if move is None:
            return
        choice[move[0]] = move[1]


def greedy_upgrades(grid: Grid, budget_gpu: float, budget_host: float) -> np.ndarray | None:
    """The greedy-upgrade candidate, or None when it finds nothing that fits."""
    choice = min_gpu_start(grid)
    if grid.totals(choice)[0] > budget_gpu:
        return None
    repair_host(grid, choice, budget_gpu, budget_host)
    if not grid.fits(choice, budget_gpu, budget_host):
        return None
    top_up(grid, choice, budget_gpu, budget_host)
    return choice


def _priced_choice(cost: np.ndarray, gpu: np.ndarray, host: np.ndarray, a: np.ndarray,
                   b: np.ndarray) -> np.ndarray:
    """Choices for P price points at once: (P,) prices -> (P, tables) variant indices."""
    with np.errstate(invalid="ignore"):
        total = cost[None] + a[:, None, None] * gpu[None] + b[:, None, None] * host[None]
    return np.argmin(np.where(np.isfinite(cost)[None], total, np.inf), axis=2)


def _bisect_first_price(grid: Grid, fixed: np.ndarray, budget: float,
                        gpu_is_bisected: bool) -> np.ndarray:
    """For each fixed price, the lowest bisected price that fits ``budget``: (P, tables) choices."""
    g, h, c = grid.gpu, grid.host, grid.cost
    # Normalize so that prices of order 1 trade a whole budget against the whole cost.
    scale_cost = max(float(np.nanmin(np.where(np.isfinite(c), c, np.nan), axis=1).sum()), 1e-30)
    usage = g if gpu_is_bisected else h
    lo = np.full(fixed.shape, -12.0)
    hi = np.full(fixed.shape, 12.0)
    rows = np.arange(len(g))

    def choose(log_price: np.ndarray) -> np.ndarray:
        price = scale_cost * 10.0 ** log_price / max(budget, 1.0)
        other = scale_cost * fixed / max(budget, 1.0)
        a, b = (price, other) if gpu_is_bisected else (other, price)
        return _priced_choice(c, g, h, a, b)

    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        used = usage[rows[None, :], choose(mid)].sum(axis=1)
        ok = used <= budget
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return choose(hi)


def lagrangian_candidates(grid: Grid, budget_gpu: float, budget_host: float) -> list[np.ndarray]:
    """Feasible choices found by pricing bytes, cheapest first (at most a few)."""
    found = []
    for gpu_is_bisected, budget in ((True, budget_gpu), (False, budget_host)):
        choices = _bisect_first_price(grid, _PRICE_LADDER, budget, gpu_is_bisected)
        found.extend(c for c in choices if grid.fits(c, budget_gpu, budget_host))
    found.sort(key=lambda c: grid.totals(c)[2])
    unique: list[np.ndarray] = []
    for choice in found:
        if not any(np.array_equal(choice, u) for u in unique):
            unique.append(choice.copy())
        if len(unique) == _TOP_UP:
            break
    return unique


def _pair_candidates(grid: Grid, choice: np.ndarray) -> tuple[np.ndarray, ...]:
    """Flat indices and deltas of every single move, restricted to the costliest tables."""
    width = grid.gpu.shape[1]
    d_cost = grid.cost - grid.pick(choice, grid.cost)[:, None]
    if d_cost.size > _PAIR_MOVES:
        keep = np.zeros(len(choice), dtype=bool)
        keep[np.argsort(-grid.pick(choice, grid.cost))[:max(2, _PAIR_MOVES // width)]] = True
        d_cost = np.where(keep[:, None], d_cost, np.inf)
    d_gpu = (grid.gpu - grid.pick(choice, grid.gpu)[:, None]).ravel()
    d_host = (grid.host - grid.pick(choice, grid.host)[:, None]).ravel()
    d_cost = d_cost.ravel()
    finite = np.isfinite(d_cost)
    down, up = np.nonzero(finite & (d_cost > 0))[0], np.nonzero(finite & (d_cost < 0))[0]
    return down, up, d_gpu, d_host, d_cost


def pair_exchange(grid: Grid, choice: np.ndarray, budget_gpu: float, budget_host: float) -> None:
    """Apply, in place, the best cost-lowering pair of moves that fits, then top up; repeat."""
    width = grid.gpu.shape[1]
    for _ in range(_PAIR_ROUNDS):
        gpu, host, _ = grid.totals(choice)
        down, up, d_gpu, d_host, d_cost = _pair_candidates(grid, choice)
        total = d_cost[down][:, None] + d_cost[up][None, :]
        ok = (total < 0) & ((down // width)[:, None] != (up // width)[None, :]) \
            & (d_gpu[down][:, None] + d_gpu[up][None, :] <= budget_gpu - gpu) \
            & (d_host[down][:, None] + d_host[up][None, :] <= budget_host - host)
        if not ok.any():
            return
        i, j = divmod(int(np.argmin(np.where(ok, total, np.inf))), len(up))
        for move in (down[i], up[j]):
            choice[move // width] = move % width
        top_up(grid, choice, budget_gpu, budget_host)


def search(grid: Grid, budget_gpu: float, budget_host: float) -> np.ndarray | None:
    """The cheapest choice that fits both budgets among all heuristics, or None."""
    candidates = lagrangian_candidates(grid, budget_gpu, budget_host)
    for choice in candidates:
        top_up(grid, choice, budget_gpu, budget_host)
    greedy = greedy_upgrades(grid, budget_gpu, budget_host)
    if greedy is not None:
        candidates.append(greedy)
    if not candidates:
        return None
    best = min(candidates, key=lambda c: grid.totals(c)[2])
    pair_exchange(grid, best, budget_gpu, budget_host)
    return best

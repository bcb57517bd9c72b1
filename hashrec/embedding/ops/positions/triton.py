"""Triton gradient rows with the reference's signature (see ``reference.py``).

One kernel over the ids: each finds its bag in the bags' ends (a cumulative sum), so
zero-length bags need no special case and the host reads nothing. The search starts at
the bag an even spread would give (id p of n among B bags: bag p * B // n) and gallops
out from it to a bracket, then bisects it: with bags of one id each (a pooled feature,
one id a sample) the guess is the answer, confirmed in two loads, where a bisection of
all bags takes log2(B) dependent loads (20 for a step of 1M samples). On an H200 the
layer's backward of 10 pooled tables, 1M ids, took 0.526 ms against 0.543 with SGD and
0.689 against 0.705 with Adam (benchmarks/results/embedding_layer_gpu.md as of commit
e3dee0e against _before_bag_search.md, one call). Bags of random lengths take about as
many loads as the bisection (gallop and bisect each cover the guess's distance). Three
launches in all, where the reference takes about a dozen. With ``order``, lane i finds
id ``order[i]``: the rows come out in the order the gradient reduction reads them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch

_BLOCK = 1024


@fast_launch
@triton.jit(do_not_specialize=["n", "num_bags"])
def _rows_kernel(ends_ptr, lengths_ptr, first_ptr, sequence_ptr, order_ptr, rows_ptr,
                 bags_ptr, n, num_bags, ORDER: tl.constexpr, BLOCK: tl.constexpr):
    """The bag of id p is the first whose end lies past p: in [lo, hi] below. Lane i
    finds id i, or id ``order[i]`` (ORDER)."""
    lane = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lane < n
    p = tl.load(order_ptr + lane, mask=mask, other=0) if ORDER else lane
    guess = tl.minimum(p * num_bags // n, num_bags - 1)
    past = tl.load(ends_ptr + guess, mask=mask, other=0) > p  # the bag is guess or before
    lo = tl.where(past, 0, guess + 1)
    hi = tl.where(past, guess, num_bags - 1)
    # Gallop away from the guess, 1, 2, 4, ... bags, until a probe crosses p.
    dist = tl.full([BLOCK], 1, dtype=tl.int64)
    open_ = mask & (lo < hi)
    while tl.max(open_.to(tl.int32), axis=0) > 0:
        q = tl.where(past, guess - dist, guess + dist)
        q_in = open_ & (q >= lo) & (q <= hi)
        q_past = tl.load(ends_ptr + q, mask=q_in, other=0) > p
        hi = tl.where(q_in & q_past, q, hi)
        lo = tl.where(q_in & ~q_past, q + 1, lo)
        open_ = q_in & (q_past == past)  # not crossed yet
        dist = dist * 2
    open_ = mask & (lo < hi)
    while tl.max(open_.to(tl.int32), axis=0) > 0:  # bisect the bracket
        mid = (lo + hi) // 2
        right = tl.load(ends_ptr + mid, mask=open_, other=0) <= p
        lo = tl.where(open_ & right, mid + 1, lo)
        hi = tl.where(open_ & ~right, mid, hi)
        open_ = open_ & (lo < hi)
    bag = lo
    start = tl.load(ends_ptr + bag, mask=mask, other=0) - tl.load(lengths_ptr + bag, mask=mask,
                                                                   other=0)
    row = tl.load(first_ptr + bag, mask=mask, other=0) + (p - start) * tl.load(
        sequence_ptr + bag, mask=mask, other=0)
    tl.store(rows_ptr + lane, row, mask=mask)
    tl.store(bags_ptr + lane, bag, mask=mask)


def gradient_rows(lengths: torch.Tensor, first: torch.Tensor, sequence: torch.Tensor,
                  n: int, order: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row of each id's output gradient, and its bag: -> (rows (n,), bags (n,)) int64;
    with ``order``, entry q is id ``order[q]``'s."""
    num_bags = lengths.numel()
    if first.shape != (num_bags,) or sequence.shape != (num_bags,):
        raise ValueError(f"first and sequence must be ({num_bags},), got "
                         f"{tuple(first.shape)} and {tuple(sequence.shape)}")
    if order is not None and order.shape != (n,):
        raise ValueError(f"order must be ({n},), got {tuple(order.shape)}")
    rows = torch.empty(n, dtype=torch.int64, device=lengths.device)
    bags = torch.empty(n, dtype=torch.int64, device=lengths.device)
    if n == 0:
        return rows, bags
    ends = torch.cumsum(lengths, 0)
    _rows_kernel[(cdiv(n, _BLOCK),)](
        ends, lengths.contiguous(), first.contiguous(), sequence.contiguous(),
        order.contiguous() if order is not None else ends, rows, bags, n, num_bags,
        ORDER=order is not None, BLOCK=_BLOCK)
    return rows, bags

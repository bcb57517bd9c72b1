"""Cut a stream of pyarrow tables into batches of a fixed size, optionally shuffled."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa


def _cut(tables: Iterable[pa.Table], batch_size: int, drop_remainder: bool, flush_rows: int,
         keep_rows: int, mix: Callable[[pa.Table], pa.Table]) -> Iterator[pa.Table]:
    """Gather rows until ``flush_rows`` are pending, ``mix`` them, emit full batches from
    the front while more than ``keep_rows`` stay pending; at the end emit everything."""
    pending: list[pa.Table] = []
    rows = 0
    for table in tables:
        pending.append(table)
        rows += table.num_rows
        if rows < flush_rows:
            continue
        joined = mix(pa.concat_tables(pending))
        emit = max(rows - keep_rows, 0) // batch_size * batch_size
        for start in range(0, emit, batch_size):
            yield joined.slice(start, batch_size)
        pending, rows = [joined.slice(emit)], rows - emit
    if not rows:
        return
    joined = mix(pa.concat_tables(pending))
    for start in range(0, rows, batch_size):
        if start + batch_size <= rows or not drop_remainder:
            yield joined.slice(start, batch_size)


def rebatch(tables: Iterable[pa.Table], batch_size: int, drop_remainder: bool
            ) -> Iterator[pa.Table]:
    """Yield tables of exactly ``batch_size`` rows in stream order, then the remainder
    (unless ``drop_remainder``)."""
    return _cut(tables, batch_size, drop_remainder, batch_size, 0, lambda t: t)


def shuffle_rebatch(tables: Iterable[pa.Table], batch_size: int, drop_remainder: bool,
                    buffer_rows: int, rng: np.random.Generator) -> Iterator[pa.Table]:
    """Like :func:`rebatch`, with rows shuffled through a buffer of ``buffer_rows``.

    Whenever the buffer is full it is permuted and the front is emitted as
    batches; the back half stays to mix with the rows that follow.
    """
    def mix(table: pa.Table) -> pa.Table:
        return table.take(pa.array(rng.permutation(table.num_rows)))

    return _cut(tables, batch_size, drop_remainder, buffer_rows, buffer_rows // 2, mix)

"""Shared by the fixed-size lookup tests: the backend switch, table options, the
batches and the runs of them that the Triton and reference paths must agree on.

Import it after ``TRITON_INTERPRET`` is set (as the test modules do, on CPU-only hosts):
it imports the table package, whose kernels read that setting.
"""

from __future__ import annotations

import contextlib
import os
from functools import partial

import pytest
import torch
from host_reads import HostReads

from hashrec.table import HashTable, TableOptions
from hashrec.table.ops import dispatch
from hashrec.table.options import AdmissionOptions, InitializerArgs

# Counts the operations that read the device on the host, Tensor.tolist included.
SyncCounter = partial(HostReads, tolist=True)


@contextlib.contextmanager
def backend(triton: bool):
    if triton and torch.cuda.is_available():
        pytest.skip("runs the kernels interpreted on CPU tensors (CPU-only hosts)")
    dispatch._forced.cache_clear()
    os.environ["HASHREC_FORCE_TRITON"] = "1" if triton else "0"
    try:
        yield
    finally:
        os.environ.pop("HASHREC_FORCE_TRITON", None)
        dispatch._forced.cache_clear()


def table_options(strategy: str, admission: bool, full: bool, check_mode: str = "IGNORE"):
    return TableOptions(
        dim=3, max_capacity=64 if full else 256, init_capacity=32, bucket_capacity=8,
        score_strategy=strategy, check_mode=check_mode, seed=1,
        initializer=InitializerArgs(mode="UNIFORM", key_seed=3),
        admission=AdmissionOptions(threshold=2, counter_capacity=48,
                                   counter_bucket_capacity=8) if admission else None)


def step_batches(tagged: bool, steps: int = 4):
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        keys = torch.randint(0, 160, (60,), generator=gen)
        tags = torch.randint(0, 2, (60,), generator=gen, dtype=torch.int32) if tagged else None
        pairs = torch.unique(keys * 2 + (tags if tagged else 0))
        keys = pairs // 2
        tags = (pairs % 2).to(torch.int32) if tagged else None
        counts = torch.randint(1, 3, keys.shape, generator=gen)
        yield keys, tags, counts, torch.randint(0, 9, keys.shape, generator=gen)


def run_batches(options: TableOptions, triton: bool, tagged: bool, mark_state: bool = False,
         call: str = "lookup") -> list:
    """Lookups of ``step_batches``; ``mark_state`` sets the looked-up rows' optimizer state to
    7 after each but the last, as training would change it (a slot the last insert takes
    must get its initial state back, which the export then shows). Other ``call``s take
    each batch with its keys repeated: ``find_or_insert`` (founds in place of slots),
    ``insert_or_assign`` and ``load_state`` (each repeat its own row; a find after each,
    in place of slots and values); with ``mark_state`` every slot's state is then set."""
    out = []
    with backend(triton):
        table = HashTable(options)
        assert table._fixed_path() is triton
        batches = list(step_batches(tagged))
        for step, (keys, tags, counts, scores) in enumerate(batches):
            table.advance_step()
            custom = scores if options.score_strategy.value == "CUSTOMIZED" else None
            if call != "lookup":
                out.append(write_call(table, call, keys, tags, counts, custom, scores))
                if mark_state and step < len(batches) - 1:  # every slot, stored or empty
                    table.storage.values[:, options.dim:] = 7.0
                continue
            res = table.lookup(keys, tags, train=True, counts=counts, scores=custom)
            out.append((res.slots, res.values))
            if mark_state and step < len(batches) - 1:
                table.storage.values[res.slots[res.slots >= 0], options.dim:] = 7.0
        state = {(k, t): (r.tolist(), s) for keys, tags, rows, scores in table.export_state(512)
                 for k, t, r, s in zip(keys.tolist(), tags.tolist(), rows, scores.tolist())}
        counters = table.admission_state()
        out.append((table.stats(), state, sorted(zip(*(c.tolist() for c in counters)))))
    return out


def write_call(table: HashTable, call: str, keys, tags, counts, custom, scores):
    """One write call of a batch (CPU tensors, moved to the table's device) with its keys
    repeated; returns a find of the keys after it (find_or_insert: its own outcome)."""
    many = torch.arange(keys.numel()).repeat_interleave(counts)
    keys, tags = keys[many], None if tags is None else tags[many]
    scores, custom = scores[many], None if custom is None else custom[many]
    rows = torch.arange(keys.numel() * table.row_dim, dtype=torch.float32).view(
        keys.numel(), table.row_dim) / 7 - keys[:, None] % 5
    on = table.device
    keys, tags, rows = keys.to(on), None if tags is None else tags.to(on), rows.to(on)
    if call == "find_or_insert":
        values, found = table.find_or_insert(
            keys, None if custom is None else (custom - many % 2).to(on), tags)
        return found, values
    if call == "insert_or_assign":
        table.insert_or_assign(keys, rows[:, :table.dim],
                               None if custom is None else custom.to(on), tags)
    else:
        table.load_state(keys, tags, rows, (scores + many % 3).to(on))
    values, found = table.find(keys, tags)
    return found, values

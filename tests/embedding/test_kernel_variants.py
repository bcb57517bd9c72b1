"""Training compiles each kernel's variants in its first step: later batches, whatever
their sizes and wherever a joined storage's keys start, reach no variant that differs
from an earlier one only in a pointer's 16-byte alignment or an integer's divisibility
by 16, each of which Triton compiles anew (a stall of up to seconds per kernel,
mid-training, on a fresh kernel cache).

The collection runs its Triton kernels under the interpreter (``HASHREC_FORCE_TRITON``),
every launch logged with its step; a process without the interpreter then gives each
launch the specialization the GPU launcher would (``tests.compile_check``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.embedding import (  # noqa: E402
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import (  # noqa: E402
    AdmissionOptions,
    InitializerArgs,
    SparseAdagrad,
    TableOptions,
)
from hashrec.table.ops import dispatch  # noqa: E402
from hashrec.table.ops.launch import FastKernel  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.compile_check import _describe, _kernel_name  # noqa: E402

DIM = 4
FEATURES = [EmbeddingFeatureSpec("user", "user_t"), EmbeddingFeatureSpec("item", "item_t"),
            EmbeddingFeatureSpec("hist", "item_t", is_sequence=True, max_length=2),
            EmbeddingFeatureSpec("cat", "cat_t", weighted=True)]
# Kernel arguments allowed to add a variant after the first step (the reasons are at the
# kernels): find and the pooling keep the sizes that mask their row tiles specialized.
ALLOWED = {("hashrec.table.ops.find.triton", "_find_kernel"): {"n"},
           ("hashrec.embedding.ops.fused.triton", "_pool_kernel_narrow"): {"num_bags"},
           ("hashrec.embedding.ops.fused.triton", "_pool_kernel_wide"): {"num_bags"}}


def _collection() -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=3)
    tables = [
        EmbeddingTableSpec("user_t", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=256, bucket_capacity=16, initializer=init,
            admission=AdmissionOptions(threshold=2, counter_capacity=256,
                                       counter_bucket_capacity=16))),
        EmbeddingTableSpec("item_t", DIM, dynamic=TableOptions(
            dim=DIM, max_capacity=256, bucket_capacity=16, initializer=init)),
        EmbeddingTableSpec("cat_t", DIM, num_rows=50, initializer=init),
    ]
    torch.manual_seed(0)
    return EmbeddingCollection(tables, FEATURES, SparseAdagrad(lr=0.05), "cpu")


def _batch(step: int, users: int, items: int) -> KeyedJaggedTensor:
    """``users`` samples of distinct users, items and categories, and two history items
    each; ``items`` distinct ones among the items and history together."""
    base = 1000 * step
    user = torch.arange(users) + base
    item = torch.arange(users) + base
    hist = (torch.arange(2 * users) % max(1, items - users)) + base + 500
    cat = torch.arange(users) % 50
    lengths = torch.cat([torch.ones(users), torch.ones(users), torch.full((users,), 2),
                         torch.ones(users)]).long()
    values = torch.cat([user, item, hist, cat])
    weights = torch.rand(values.numel(), generator=torch.Generator().manual_seed(step))
    return KeyedJaggedTensor.from_lengths([f.name for f in FEATURES], values, lengths,
                                          weights)


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches run compiled on CUDA")
def test_later_steps_compile_no_variant_for_alignment_or_sizes(tmp_path, monkeypatch):
    # Step 0: 7 users (the item table's keys start 7 keys into the join's: unaligned) and
    # counts not divisible by 16; step 1: 16 users and 32 items (aligned, divisible);
    # then a short batch.
    shapes = [(7, 12), (16, 32), (5, 9)]
    log, step = [], [0]
    launch = FastKernel.launch

    def logged(self, grid, args, kwargs):
        module, name = _kernel_name(self)
        log.append(json.dumps({"module": module, "kernel": name, "step": step[0],
                               "args": [_describe(a) for a in args],
                               "kwargs": {k: _describe(v) for k, v in kwargs.items()}},
                              sort_keys=True))
        return launch(self, grid, args, kwargs)

    monkeypatch.setattr(FastKernel, "launch", logged)
    monkeypatch.setenv("HASHREC_FORCE_TRITON", "1")
    dispatch._forced.cache_clear()
    try:
        collection = _collection()
        for step[0], (users, items) in enumerate(shapes):
            out = collection(_batch(step[0], users, items))
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            (loss + out.sequences["hist"][0].sum()).backward()
    finally:
        dispatch._forced.cache_clear()
    path = tmp_path / "launches.jsonl"
    path.write_text("\n".join(dict.fromkeys(log)) + "\n")
    assert {json.loads(line)["step"] for line in log} == {0, 1, 2}

    script = (
        "import json, sys\n"
        "from tests.compile_check import _source\n"
        "allowed = {tuple(k): set(v) for k, v in json.loads(sys.argv[2])}\n"
        "seen, late = {}, []\n"
        "for line in open(sys.argv[1]):\n"
        "    entry = json.loads(line)\n"
        "    source, options = _source(entry)\n"
        "    fn = source.fn\n"
        "    skip = allowed.get((entry['module'], entry['kernel']), set())\n"
        "    attrs = sorted(fn.arg_names[k[0]] for k in source.attrs\n"
        "                   if fn.arg_names[k[0]] not in skip)\n"
        "    key = json.dumps([entry['module'], entry['kernel'], source.signature,\n"
        "                      sorted((str(k), repr(v)) for k, v in source.constants.items()\n"
        "                             if fn.arg_names[k[0]] not in skip),\n"
        "                      sorted(options.items())], sort_keys=True)\n"
        "    variants = seen.setdefault(key, {})\n"
        "    if attrs not in variants.values() and variants and entry['step'] > 0:\n"
        "        first = next(iter(variants.values()))\n"
        "        late.append(f\"step {entry['step']} {entry['kernel']}: \"\n"
        "                    f\"{sorted(set(first) ^ set(attrs))}\")\n"
        "    variants.setdefault(json.dumps(attrs), attrs)\n"
        "print(json.dumps(late))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                            "HASHREC_FORCE_TRITON")}
    allowed = json.dumps([[list(k), sorted(v)] for k, v in ALLOWED.items()])
    run = subprocess.run([sys.executable, "-c", script, str(path), allowed], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [], run.stdout

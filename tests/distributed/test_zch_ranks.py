"""ZCH tables on 2 gloo ranks: the replicated remappers assign and evict like one process.

Rank r takes rows [r * B, (r + 1) * B) of each global batch of 2 * B rows. Ids come
from a skewed range larger than the table, so slots fill, candidates wait and
evictions reassign slots. With a key-seeded initializer the two ranks must equal
one process trained on the global batches (remapper state, rows, head); with an
unseeded one, each rank's generator seeded apart, the ranks must still agree with
each other (re-initialized rows are rank 0's).
"""

from __future__ import annotations

import pytest
import torch
from dist_workers import run_world

from hashrec.distributed.data_parallel import all_reduce_gradients
from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.embedding.zch import ZchOptions
from hashrec.table import InitializerArgs, SparseAdagrad

WORLD, ROWS, STEPS, DIM, SLOTS = 2, 8, 12, 4, 12


def _device(ctx) -> torch.device:
    return ctx.device if ctx is not None else torch.device("cpu")


def _collection(ctx, seeded: bool) -> EmbeddingCollection:
    init = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=5 if seeded else None)
    zch = ZchOptions(zch_size=SLOTS, eviction_interval=3, policy="DISTANCE_LFU")
    return EmbeddingCollection([EmbeddingTableSpec("z", DIM, num_rows=SLOTS, zch=zch,
                                                   initializer=init)],
                               [EmbeddingFeatureSpec("u", "z")], SparseAdagrad(lr=0.1),
                               _device(ctx), dist=ctx)


def _global_batch(step: int) -> tuple[list[list[int]], torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    n = WORLD * ROWS
    # Squares of uniforms: low ids are frequent, 40 ids compete for 12 slots.
    ids = (torch.rand(n, 2, generator=g).pow(2) * 40).long() + 1000
    return ids.tolist(), torch.randint(0, 2, (n,), generator=g).float()


def _train(ctx=None, seeded: bool = True):
    collection = _collection(ctx, seeded)
    torch.manual_seed(0)
    device = _device(ctx)
    head = torch.nn.Linear(DIM, 1).to(device)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    rank = ctx.rank if ctx is not None else 0
    rows = slice(rank * ROWS, (rank + 1) * ROWS) if ctx is not None else slice(None)
    if not seeded:
        torch.manual_seed(1 + rank)  # the ranks' generators differ
    reset = 0
    for step in range(STEPS):
        bags, labels = _global_batch(step)
        bags = bags[rows]
        kjt = KeyedJaggedTensor.from_lengths(
            ["u"], torch.tensor([i for bag in bags for i in bag], dtype=torch.int64),
            torch.tensor([len(bag) for bag in bags], dtype=torch.int64)).to(device)
        labels = labels.to(device)
        before = collection.zch_remappers["z"].slot_keys.clone()
        optimizer.zero_grad()
        logits = head(collection(kjt).pooled["u"]).squeeze(1)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[rows]).backward()
        if ctx is not None:
            all_reduce_gradients(list(head.parameters()), ctx)
        optimizer.step()
        if step % 3 == 2:
            reset += int((collection.zch_remappers["z"].slot_keys != before).sum())
    state = {k: v.cpu().clone() for k, v in collection.state_dict().items()}
    return {"state": state, "head": [p.detach().cpu().clone() for p in head.parameters()],
            "reset": reset}


def scenario_seeded(ctx):
    return _train(ctx, seeded=True)


def scenario_unseeded(ctx):
    return _train(ctx, seeded=False)


def scenario_gathered(ctx):
    """``scenario_seeded`` with the table's gradients on the all-gather of large tables."""
    from hashrec.embedding import sharded

    limit, sharded.DENSE_REDUCE_MAX_ELEMENTS = sharded.DENSE_REDUCE_MAX_ELEMENTS, 0
    try:
        return _train(ctx, seeded=True)
    finally:
        sharded.DENSE_REDUCE_MAX_ELEMENTS = limit


def _same_state(a: dict, b: dict, atol: float = 2e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if a[name].dtype.is_floating_point:
            assert torch.allclose(a[name], b[name], atol=atol, rtol=1e-5), name
        else:
            assert torch.equal(a[name], b[name]), name


def test_two_ranks_remap_evict_and_train_like_one_process(tmp_path):
    worlds = run_world({"seeded": scenario_seeded, "unseeded": scenario_unseeded,
                        "gathered": scenario_gathered}, WORLD, tmp_path)
    for ranks in worlds.values():
        for r in ranks:
            if isinstance(r, Exception):
                raise r
    reference = _train(seeded=True)
    assert reference["reset"] > 0  # evictions reassigned slots
    for r in worlds["seeded"] + worlds["gathered"]:
        _same_state(r["state"], reference["state"])
        for mine, ref in zip(r["head"], reference["head"]):
            assert torch.allclose(mine, ref, atol=2e-6, rtol=1e-5)
    first, second = worlds["unseeded"]
    assert first["reset"] > 0
    _same_state(first["state"], second["state"])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_remap_and_evict_alike(tmp_path):
    """Two ranks on two GPUs (NCCL): the ids' all-gather and the rows' broadcast on the
    device; the same slots as one CPU process, rows within float tolerance."""
    worlds = run_world({"seeded": scenario_seeded, "unseeded": scenario_unseeded}, WORLD,
                       tmp_path, cuda=True)
    for ranks in worlds.values():
        for r in ranks:
            if isinstance(r, Exception):
                raise r
    reference = _train(seeded=True)
    for r in worlds["seeded"]:
        _same_state(r["state"], reference["state"], atol=1e-4)
    first, second = worlds["unseeded"]
    _same_state(first["state"], second["state"])

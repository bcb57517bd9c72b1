"""The collection on CUDA (Triton ops where present) matches the CPU reference path."""

import pytest
import torch

from hashrec.embedding import EmbeddingCollection, EmbeddingFeatureSpec, EmbeddingTableSpec
from hashrec.table import InitializerArgs, SparseAdam, TableOptions

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DIM, NUM_IDS = 8, 50
# Two dense tables (one group: its ids sort as rows), runs of sum features on both
# storages (pooled in one launch), a mean, a weighted and a sequence feature.
FEATURES = [EmbeddingFeatureSpec("d", "dense"), EmbeddingFeatureSpec("e", "dense2"),
            EmbeddingFeatureSpec("u", "user", pooling="mean"),
            EmbeddingFeatureSpec("u2", "user"), EmbeddingFeatureSpec("i2", "item"),
            EmbeddingFeatureSpec("i", "item", weighted=True),
            EmbeddingFeatureSpec("h", "item", is_sequence=True, max_length=3)]


def _collection(device):
    seeded = InitializerArgs(mode="NORMAL", std_dev=0.1, key_seed=5)
    dynamic = [EmbeddingTableSpec(name, DIM, fusion_group="g", dynamic=TableOptions(
        dim=DIM, max_capacity=512, bucket_capacity=32, initializer=seeded))
        for name in ("user", "item")]
    dense = [EmbeddingTableSpec(name, DIM, num_rows=NUM_IDS, initializer=seeded)
             for name in ("dense", "dense2")]
    return EmbeddingCollection([*dense, *dynamic], FEATURES, SparseAdam(lr=0.05), device)


@pytest.mark.parametrize("ahead", [False, True], ids=["dedup_in_forward", "dedup_ahead"])
def test_cuda_matches_cpu(make_kjt, ahead):
    collections = {device: _collection(device) for device in ("cpu", "cuda")}
    kjts = [make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=step, weighted=True)
            for step in range(3)]
    on_cuda = [kjt.to("cuda") for kjt in kjts]
    for step, kjt in enumerate(kjts):
        outs = {"cpu": collections["cpu"](kjt), "cuda": collections["cuda"](on_cuda[step])}
        if ahead and step + 1 < len(kjts):  # as a training step does for the next batch
            collections["cuda"].prepare(on_cuda[step + 1])
        for name in outs["cpu"].pooled:
            torch.testing.assert_close(outs["cuda"].pooled[name].cpu(), outs["cpu"].pooled[name],
                                       rtol=1e-4, atol=1e-5)
        for out in outs.values():
            loss = sum((t ** 2).sum() for t in out.pooled.values())
            (loss + out.sequences["h"][0].sum()).backward()
    cpu, cuda = (collections[d].stats()["tables"] for d in ("cpu", "cuda"))
    assert {k: v["size"] for k, v in cpu.items()} == {k: v["size"] for k, v in cuda.items()}

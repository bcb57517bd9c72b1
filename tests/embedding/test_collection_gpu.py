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


SLEEP_CYCLES = 1 << 31  # about a second of the device's clock


def _block(stream: torch.cuda.Stream) -> None:
    """Keeps ``stream`` busy for about a second from now."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)


def test_prepared_sorts_run_beside_the_current_stream(make_kjt, monkeypatch):
    """A prepared batch's sorts wait on the dedup stream (not on the current one), and
    the forward reads them as the current stream's own sorts would have made them."""
    from hashrec.embedding import batching, dedup_graphs

    names = [f.name for f in FEATURES]
    kjts = [make_kjt(names, 16, NUM_IDS, seed=step, weighted=True).to("cuda")
            for step in range(6)]  # sorts uncaptured, captured, then replayed
    monkeypatch.setattr(dedup_graphs, "_GRAPHS", {})
    monkeypatch.setenv(batching.ASIDE_ENV, "0")
    reference = _collection("cuda")
    expected = [reference(kjt) for kjt in kjts]  # compiles every kernel, too
    monkeypatch.setattr(dedup_graphs, "_GRAPHS", {})
    monkeypatch.setenv(batching.ASIDE_ENV, "1")
    collection = _collection("cuda")
    device = torch.device("cuda", torch.cuda.current_device())  # what names the sorts
    graphs, side = dedup_graphs.graphs_for(device), batching.dedup_stream(device)
    for step, kjt in enumerate(kjts):
        torch.cuda.synchronize()
        _block(side)
        captures = graphs.captures
        collection.prepare(kjt)
        if graphs.captures == captures:  # (a capture first waits for the whole device)
            assert not collection._ahead[-1][2]._event.query()  # behind the sleep
        out = collection(kjt)
        for name, value in expected[step].pooled.items():
            torch.testing.assert_close(out.pooled[name], value)
        torch.testing.assert_close(out.sequences["h"][0], expected[step].sequences["h"][0])


def test_a_prepared_batch_dropped_unread_is_waited_for(make_kjt, monkeypatch):
    """Past the batches kept ahead the oldest is dropped, and the current stream waits
    for its sorts (they may still read ids whose memory it reuses once freed)."""
    from hashrec.embedding import batching, dedup_graphs

    # No captures (a capture first waits for the whole device, the sleep included).
    monkeypatch.setattr(dedup_graphs, "CAPTURE_AFTER", 1 << 30)

    collection = _collection("cuda")
    kjts = [make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=step, weighted=True)
            .to("cuda") for step in range(3)]
    collection(kjts[0])  # compiles the kernels
    torch.cuda.synchronize()
    _block(batching.dedup_stream(torch.device("cuda")))
    collection.prepare(kjts[0])
    collection.prepare(kjts[1])
    torch.cuda.current_stream().synchronize()  # it waits for nothing yet
    assert not collection._ahead[0][2]._event.query()
    collection.prepare(kjts[2])  # drops kjts[0]'s, still behind the sleep
    after = torch.cuda.Event()
    after.record()
    assert not after.query()
    torch.cuda.synchronize()
    assert [entry[0] for entry in collection._ahead] == kjts[1:]


def test_sorts_kept_on_the_current_stream_do_not_wait_for_the_dedup_stream(make_kjt):
    """``aside=False`` (a rank of several: its sorts stay on the training stream)."""
    from hashrec.embedding import batching

    collection = _collection("cuda")
    kjt = make_kjt([f.name for f in FEATURES], 16, NUM_IDS, seed=1, weighted=True).to("cuda")
    storages = collection._read_storages()
    ids = collection._feature_ids(storages, kjt)
    entries = [collection._dedup_entry(storages, ids, join)
               for join in collection._joins(storages)]
    batching.dedup_storages(entries)  # compiles the kernels
    torch.cuda.synchronize()
    side = batching.dedup_stream(torch.device("cuda"))
    _block(side)
    here = batching.dedup_storages(entries, aside=False)
    torch.cuda.current_stream().synchronize()
    assert not side.query()  # done while the dedup stream still sleeps
    aside = batching.dedup_storages(entries)  # behind the sleep
    for a, b in zip(here, aside):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.inverse, b.inverse)

"""Storage tiers: HBM_ONLY, HYBRID and CACHING give the same lookups, updates and tables.

On CPU every tier is host memory, so these tests check the placement logic (bucket
split, cache admission, write-back, growth) against HBM_ONLY for one key stream.
"""

from __future__ import annotations

import pytest
import torch

from hashrec.embedding import (
    EmbeddingCollection,
    EmbeddingFeatureSpec,
    EmbeddingTableSpec,
    KeyedJaggedTensor,
)
from hashrec.table import (
    AdmissionOptions,
    HashTable,
    InitializerArgs,
    SparseAdam,
    SparseRowWiseAdagrad,
    SparseSGD,
    TableOptions,
)
from hashrec.table.tiers.caching import cache_rows
from hashrec.table.tiers.hybrid import device_buckets

MODES = {"hbm": (1.0, False), "hybrid": (0.25, False), "caching": (0.25, True)}
LOGICAL = ("lookups", "hits", "inserts", "evictions", "refused", "admission_rejected",
           "growths", "size", "capacity", "counter_evictions")


def _options(clf: float, caching: bool, optimizer, **overrides) -> TableOptions:
    fields = dict(dim=4, max_capacity=256, init_capacity=32, bucket_capacity=16, seed=7,
                  optimizer=optimizer, admission=AdmissionOptions(threshold=2),
                  check_mode="IGNORE", cache_load_factor=clf, caching=caching)
    fields.update(overrides)
    return TableOptions(**fields)


def _stream(steps: int, n: int, key_range: int, seed: int = 0) -> list[torch.Tensor]:
    """Power-law key batches with duplicates; negative keys included."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.arange(1, key_range + 1, dtype=torch.float64) ** -1.05
    perm = torch.randperm(key_range, generator=g) - key_range // 3
    return [perm[torch.multinomial(probs, n, replacement=True, generator=g)]
            for _ in range(steps)]


def _train(table: HashTable, batches, tagged: bool = False) -> list[torch.Tensor]:
    """Lookup + update per batch; returns what every lookup (train and eval) read."""
    seen = []
    for step, batch in enumerate(batches):
        table.advance_step()
        keys, counts = torch.unique(batch, return_counts=True)
        tags = (keys % 3).to(torch.int32) if tagged else None
        result = table.lookup(keys, tags=tags, train=True, counts=counts)
        seen += [result.slots, result.values]
        grads = torch.randn(keys.numel(), table.dim, generator=torch.Generator().manual_seed(step))
        stored = result.slots >= 0
        table.apply_gradients(result.slots[stored], grads[stored])
        if step % 4 == 3:
            seen.append(table.lookup(keys[::2], tags=None if tags is None else tags[::2],
                                     train=False).values)
    return seen


def _export(table: HashTable) -> list[torch.Tensor]:
    return [torch.cat(parts) for parts in zip(*table.export_state(100))]


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


OPTIMIZERS = {"sgd": SparseSGD(lr=0.1), "rowwise": SparseRowWiseAdagrad(lr=0.1),
              "adam": SparseAdam(lr=0.01)}


def _modes_train_identically(optimizer, tagged: bool, **overrides) -> dict[str, HashTable]:
    """Trains a table in every mode on one stream (growing, evicting, admitting); asserts
    that they read, store and count the same. Returns the tables by mode."""
    batches = _stream(12, 300, 3000)
    tables = {name: HashTable(_options(clf, caching, optimizer, **overrides))
              for name, (clf, caching) in MODES.items()}
    seen = {name: _train(t, batches, tagged) for name, t in tables.items()}
    stats = {name: t.stats() for name, t in tables.items()}
    assert stats["hbm"]["growths"] > 0 and stats["hbm"]["evictions"] > 0
    assert stats["hbm"]["admission_rejected"] > 0
    for name in ("hybrid", "caching"):
        _assert_same(seen[name], seen["hbm"])
        _assert_same(_export(tables[name]), _export(tables["hbm"]))
        assert {k: stats[name][k] for k in LOGICAL} == {k: stats["hbm"][k] for k in LOGICAL}
    return tables


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_modes_train_identically(optimizer, tagged):
    _modes_train_identically(optimizer, tagged)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_rows_train_identically_in_every_mode(dtype):
    """The host and cache tiers hold (and move) rows in the table's dtype."""
    tables = _modes_train_identically(SparseAdam(lr=0.01), True, dtype=dtype)
    for table in tables.values():
        assert _export(table)[2].dtype == dtype
    tiers = [tables[name]._rows.rows for name in ("hybrid", "caching")]
    assert {part.dtype for rows in tiers for part in (rows.first, rows.second)} == {dtype}


@pytest.mark.parametrize("strategy", ["LFU", "NO_EVICTION"])
def test_modes_agree_per_score_strategy(strategy):
    batches = _stream(8, 150, 1500, seed=3)
    tables = [HashTable(_options(clf, caching, SparseSGD(lr=0.1), score_strategy=strategy,
                                 admission=None)) for clf, caching in MODES.values()]
    seen = [_train(t, batches) for t in tables]
    for other in (1, 2):
        _assert_same(seen[other], seen[0])
        _assert_same(_export(tables[other]), _export(tables[0]))


def test_caching_counts_hits_fetches_and_write_backs():
    table = HashTable(_options(0.1, True, SparseSGD(lr=0.1), admission=None))
    _train(table, _stream(10, 200, 3000, seed=5))
    stats = table.stats()
    assert stats["cache_rows"] == cache_rows(table.capacity(), 0.1)
    assert 0 < stats["cache_hits"] < stats["cache_lookups"]
    assert stats["cache_hit_rate"] == stats["cache_hits"] / stats["cache_lookups"]
    assert stats["fetched_rows"] > 0 and stats["written_back_rows"] > 0
    assert stats["host_direct_rows"] > 0  # batches hold more rows than the cache


def test_caching_prefetch_serves_next_lookup_from_cache():
    table = HashTable(_options(0.5, True, SparseSGD(lr=0.1), admission=None, init_capacity=None))
    reference = HashTable(_options(1.0, False, SparseSGD(lr=0.1), admission=None,
                                   init_capacity=None))
    batches = _stream(6, 120, 2000, seed=9)
    for t in (table, reference):
        _train(t, batches[:5])
    keys = torch.unique(batches[5])
    table.prefetch(keys)
    prefetched = table.stats()["prefetched_rows"]
    before = table.stats()
    assert prefetched > 0
    got = table.lookup(keys, train=False).values
    after = table.stats()
    stored = int(table.contains(keys).sum())
    assert after["cache_hits"] - before["cache_hits"] == stored
    assert torch.equal(got, reference.lookup(keys, train=False).values)


def test_hybrid_keeps_bucket_split_through_growth():
    table = HashTable(_options(0.3, False, None, admission=None))
    splits = []
    for batch in _stream(8, 40, 5000, seed=2):
        table.lookup(torch.unique(batch))
        stats = table.stats()
        buckets = table.storage.num_buckets
        splits.append(buckets)
        assert stats["device_rows"] == device_buckets(buckets, 0.3) * 16
        assert stats["device_rows"] + stats["host_rows"] == table.capacity()
    assert splits[-1] > splits[0]


def test_checkpoint_moves_between_modes():
    batches = _stream(8, 150, 2000, seed=4)
    source = HashTable(_options(0.25, True, SparseAdam(lr=0.01)))
    _train(source, batches)
    keys, tags, rows, scores = _export(source)
    for clf, caching in MODES.values():
        target = HashTable(_options(clf, caching, SparseAdam(lr=0.01), init_capacity=None))
        target.load_state(keys, tags, rows, scores)
        got = dict(zip(_export(target)[0].tolist(), _export(target)[2]))
        assert all(torch.equal(got[k], r) for k, r in zip(keys.tolist(), rows))


@pytest.mark.parametrize("name", MODES)
def test_growing_past_max_capacity_keeps_every_entry_in_every_mode(name):
    clf, caching = MODES[name]
    table = HashTable(_options(clf, caching, SparseAdam(lr=0.01)))
    _train(table, _stream(12, 300, 3000))
    assert table.capacity() == 256 and table.stats()["evictions"] > 0  # at max_capacity
    before = _export(table)
    assert table.grow_past_max_capacity() == 512 == table.capacity()
    after = _export(table)
    at = {int(k): i for i, k in enumerate(after[0])}
    index = torch.tensor([at[int(k)] for k in before[0]])
    assert len(at) == before[0].numel()
    for saved, now in zip(before[1:], after[1:]):
        assert torch.equal(now[index], saved)
    # the new count is the limit: new keys fill it without growing, then evict
    table.lookup(torch.arange(10_000, 10_600), counts=torch.full((600,), 2))
    assert table.capacity() == 512 and table.size() > 256
    if name == "hybrid":
        assert table.stats()["device_rows"] == device_buckets(32, clf) * 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", MODES)
def test_memory_report_per_mode(name, dtype):
    clf, caching = MODES[name]
    options = _options(clf, caching, SparseAdam(lr=0.01), init_capacity=None, dtype=dtype)
    table = HashTable(options)
    report = table.memory_report()
    row_bytes = options.row_dim * dtype.itemsize
    values = table.capacity() * row_bytes
    assert report["mode"] == options.storage_mode.value
    assert table.memory_bytes() == {"gpu": 0, "host": report["gpu_tier"] + report["host_tier"]}
    index = report["gpu_tier"] - {"hbm": values, "hybrid": device_buckets(16, clf) * 16 * row_bytes,
                                  "caching": cache_rows(256, clf) * row_bytes}[name]
    assert report["host_tier"] == {"hbm": 0, "hybrid": values - device_buckets(16, clf) * 16
                                   * row_bytes, "caching": values}[name]
    assert index >= table.capacity() * (8 + 4 + 1 + 8)
    estimated = table.capacity() * -(-row_bytes // 16) * 16  # rows aligned to 16 bytes
    assert report["estimate_host"] == {"hbm": 0, "hybrid": estimated - int(clf * estimated),
                                       "caching": estimated}[name]


def _collection(clf: float, caching: bool) -> EmbeddingCollection:
    torch.manual_seed(0)
    options = TableOptions(dim=4, max_capacity=64, init_capacity=16, bucket_capacity=8,
                           seed=11, admission=AdmissionOptions(threshold=2), check_mode="IGNORE",
                           cache_load_factor=clf, caching=caching)
    tables = [EmbeddingTableSpec("a", 4, dynamic=options, fusion_group="g"),
              EmbeddingTableSpec("b", 4, dynamic=options, fusion_group="g")]
    features = [EmbeddingFeatureSpec("fa", "a"), EmbeddingFeatureSpec("fb", "b", pooling="mean"),
                EmbeddingFeatureSpec("fs", "a", is_sequence=True, max_length=3)]
    return EmbeddingCollection(tables, features, SparseAdam(lr=0.05))


def _kjt(step: int) -> KeyedJaggedTensor:
    """Bags of 0..4 ids (duplicates) for features fa, fb, fs of 32 samples."""
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 5, (3 * 32,), generator=g)
    values = torch.randint(-200, 200, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor.from_lengths(["fa", "fb", "fs"], values, lengths)


def test_collection_trains_identically_in_every_mode():
    collections = {name: _collection(*mode) for name, mode in MODES.items()}
    for step in range(8):
        kjt = _kjt(step)
        outs = {}
        for name, c in collections.items():
            out = c(kjt)
            loss = sum((t * t).sum() for t in out.pooled.values())
            loss = loss + sum((t * 0.5).sum() for t, _ in out.sequences.values())
            loss.backward()
            outs[name] = out
        for name in ("hybrid", "caching"):
            for feature in outs["hbm"].pooled:
                assert torch.equal(outs[name].pooled[feature], outs["hbm"].pooled[feature])
            assert torch.equal(outs[name].sequences["fs"][0], outs["hbm"].sequences["fs"][0])
    exports = {name: _export(next(iter(c.dynamic_tables().values())))
               for name, c in collections.items()}
    stats = next(iter(collections["hbm"].dynamic_tables().values())).stats()
    assert stats["evictions"] > 0 and stats["growths"] > 0
    for name in ("hybrid", "caching"):
        _assert_same(exports[name], exports["hbm"])


@pytest.mark.parametrize("mode", MODES, ids=MODES.keys())
def test_unstored_slots_get_no_update_in_every_mode(mode):
    """apply_gradients skips -1 slots: same table as passing the stored slots only."""
    tables = [HashTable(_options(*MODES[mode], SparseAdam(lr=0.01))) for _ in range(2)]
    for step, batch in enumerate(_stream(6, 64, 200)):
        keys, counts = torch.unique(batch, return_counts=True)
        grads = torch.randn(keys.numel(), 4, generator=torch.Generator().manual_seed(step))
        for i, table in enumerate(tables):
            table.advance_step()
            slots = table.lookup(keys, train=True, counts=counts).slots
            stored = slots >= 0
            assert not stored.all() or step  # admission leaves keys unstored early on
            if i == 0:
                table.apply_gradients(slots, grads)
            else:
                table.apply_gradients(slots[stored], grads[stored])
    _assert_same(_export(tables[0]), _export(tables[1]))


@pytest.mark.parametrize("mode", ["HBM_ONLY", "HYBRID", "CACHING"])
def test_a_find_with_a_repeated_key_loses_no_later_write(mode):
    """A repeated key in a find took two cache rows for one slot; when one was evicted
    the cache forgot the slot while the other, dirty, later overwrote its row."""
    options = TableOptions(dim=2, max_capacity=64, bucket_capacity=64,
                           cache_load_factor=1.0 if mode == "HBM_ONLY" else 4 / 64,
                           caching=mode == "CACHING", optimizer=SparseSGD(lr=1.0),
                           initializer=InitializerArgs(mode="CONSTANT", value=1.0))
    table = HashTable(options)
    table.find_or_insert(torch.arange(10))
    values, found = table.find(torch.tensor([7, 7, 99]))
    assert found.tolist() == [True, True, False]
    assert values[:2].tolist() == [[1.0, 1.0]] * 2
    table.apply_gradients(table.lookup(torch.tensor([7])).slots, torch.ones(1, 2))
    table.find(torch.tensor([0, 1, 2]))  # evicts cache rows
    table.insert_or_assign(torch.tensor([7]), torch.full((1, 2), 5.0))
    for churn in ([3, 4, 5, 6], [0, 1, 2, 8]):
        table.find(torch.tensor(churn))
        assert table.find(torch.tensor([7]))[0].tolist() == [[5.0, 5.0]]

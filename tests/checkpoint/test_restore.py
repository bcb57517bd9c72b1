"""restore_checkpoint: exact round trips, fine-tuning, mismatches and damaged files."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import pytest
import torch
from checkpoint_helpers import (
    adam_options,
    assert_same,
    batch_keys,
    gradients,
    snapshot,
    table_options,
    train_steps,
    trained_table,
)

from hashrec.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint
from hashrec.table import AdmissionOptions, HashTable, SparseSGD


def _dense(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer


def _train_dense(model, optimizer, steps: int = 3) -> None:
    for i in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 3, generator=torch.Generator().manual_seed(i))).pow(2).sum().backward()
        optimizer.step()


@pytest.mark.parametrize("options", [table_options(), adam_options(),
                                     table_options(dtype=torch.bfloat16)],
                         ids=["adagrad-admission", "adam-admission", "adagrad-bf16"])
def test_full_round_trip(tmp_path, options):
    model, optimizer = _dense(0)
    _train_dense(model, optimizer)
    table = trained_table(options=options)
    path = save_checkpoint(str(tmp_path), 8, model, optimizer, {"t": table}, chunk_rows=7)
    model2, optimizer2 = _dense(1)
    restored = HashTable(options)
    meta = restore_checkpoint(path, model2, optimizer2, {"t": restored})
    assert meta["step"] == 8 and meta["loaded"]["t"]["rows"] == table.size()
    assert_same(snapshot(restored), snapshot(table))
    assert restored.step == table.step
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    _train_dense(model, optimizer, 1)
    _train_dense(model2, optimizer2, 1)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_a_long_table_load_logs_its_progress(tmp_path, caplog, monkeypatch):
    import logging

    from hashrec.checkpoint import table_io

    table = trained_table(options=table_options())
    path = save_checkpoint(str(tmp_path), 8, None, None, {"t": table}, chunk_rows=7)
    with caplog.at_level(logging.INFO, logger="hashrec.checkpoint"):
        restore_checkpoint(path, None, None, {"t": HashTable(table_options())})
    assert "rows loaded" not in caplog.text  # a short load says nothing
    monkeypatch.setattr(table_io, "PROGRESS_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="hashrec.checkpoint"):
        restore_checkpoint(path, None, None, {"t": HashTable(table_options())})
    size = table.size()
    lines = [r.getMessage() for r in caplog.records if "rows loaded" in r.getMessage()]
    counts = [int(line.split(": ")[1].split(" ")[0]) for line in lines]
    assert len(lines) > 2 and counts == sorted(counts) and counts[-1] == size
    assert f"(the checkpoint holds {size}, over all ranks)" in lines[0]
    assert lines[-1].startswith(f"table {table.options.name!r}: {size} rows loaded in ")


def test_fine_tune_resets_optimizer_state(tmp_path):
    model, optimizer = _dense(0)
    _train_dense(model, optimizer)
    table = trained_table(options=adam_options())
    path = save_checkpoint(str(tmp_path), 8, model, optimizer, {"t": table})
    options = table_options()  # Adagrad, initial accumulator 0
    restored = HashTable(options)
    fresh_model, fresh_opt = _dense(1)
    restore_checkpoint(path, fresh_model, fresh_opt, {"t": restored}, restore_optimizer=False)
    assert fresh_opt.state_dict()["state"] == {}
    got, want = snapshot(restored), snapshot(table)
    assert torch.equal(got["keys"], want["keys"]) and torch.equal(got["scores"], want["scores"])
    assert torch.equal(got["rows"][:, :options.dim], want["rows"][:, :options.dim])
    assert torch.equal(got["rows"][:, options.dim:], torch.zeros(len(got["keys"]), options.dim))
    assert torch.equal(got["counts"], want["counts"])


def test_optimizer_mismatch_names_file_and_table(tmp_path):
    path = save_checkpoint(str(tmp_path), 1, None, None, {"user": trained_table(steps=2)})
    other = HashTable(table_options(optimizer=SparseSGD(lr=0.1)))
    with pytest.raises(CheckpointError, match=r"rank-00000-of-00001\.json \(table 'user'\).*"
                                              r"SparseAdagrad.*SparseSGD"):
        restore_checkpoint(path, None, None, {"user": other})


def test_dim_mismatch_names_file_and_table(tmp_path):
    path = save_checkpoint(str(tmp_path), 1, None, None, {"user": trained_table(steps=2)})
    wider = HashTable(table_options(dim=8))
    with pytest.raises(CheckpointError, match=r"\(table 'user'\): embedding dim 4 .* 8"):
        restore_checkpoint(path, None, None, {"user": wider}, restore_optimizer=False)


def test_unknown_table_and_missing_dense_state(tmp_path):
    path = save_checkpoint(str(tmp_path), 1, None, None, {"user": trained_table(steps=2)})
    with pytest.raises(CheckpointError,
                       match=r"dynamic table 'item' .*is not in the checkpoint.*holds user "):
        restore_checkpoint(path, None, None, {"item": HashTable(table_options())})
    with pytest.raises(CheckpointError, match="no dense model state"):
        restore_checkpoint(path, torch.nn.Linear(2, 2), None, {})


def _scored_table(rows: int, options) -> HashTable:
    """A table of ``rows`` keys whose scores are a permutation of 1..rows."""
    table = HashTable(options)
    keys = torch.randperm(10 * rows, generator=torch.Generator().manual_seed(3))[:rows]
    scores = torch.randperm(rows, generator=torch.Generator().manual_seed(4)) + 1
    values = torch.randn(rows, table.row_dim, generator=torch.Generator().manual_seed(5))
    table.load_state(keys, None, values, scores)
    return table


@pytest.mark.parametrize("capacity", [256, 608], ids=["cap256", "cap608"])
def test_a_table_too_small_keeps_the_highest_scored_rows_with_a_warning(tmp_path, caplog,
                                                                        capacity):
    # 600 rows into room for 256 (max_capacity lowered), or for 608 in buckets that the
    # keys fill unevenly (as under another number of ranks).
    options = table_options(admission=False, max_capacity=4096)
    saved = _scored_table(600, options)
    path = save_checkpoint(str(tmp_path), 1, None, None, {"t": saved})
    small = HashTable(table_options(admission=False, max_capacity=capacity))
    with caplog.at_level("WARNING"):
        meta = restore_checkpoint(path, None, None, {"t": small})
    held = int(small.size())
    assert meta["loaded"]["t"]["rows"] == 600 and 0 < held < 600
    assert "inserts refused" not in caplog.text  # the restore's own warning says it once
    assert (f"table 't': 600 rows of {path}/dynamicemb/t belong here, the table holds "
            f"{held} (room for {capacity}") in caplog.text
    assert (f"the {600 - held} rows ({100 * (600 - held) / 600:.1f}%) that scored lowest in "
            f"full buckets are not restored") in caplog.text
    assert "raise its max_capacity (the dynamicemb.max_capacity" in caplog.text
    # The rows kept are the saved rows, and mostly those of the highest scores.
    want, got = snapshot(saved), snapshot(small)
    at = {int(k): i for i, k in enumerate(want["keys"])}
    index = torch.tensor([at[int(k)] for k in got["keys"]])
    assert torch.equal(got["rows"], want["rows"][index])
    assert torch.equal(got["scores"], want["scores"][index])
    kept = set(index.tolist())

    def kept_share(scores: torch.Tensor) -> float:
        chosen = set(torch.topk(scores, held // 2).indices.tolist())
        return len(chosen & kept) / len(chosen)

    top, bottom = kept_share(want["scores"]), kept_share(-want["scores"])
    assert top >= 0.95 and bottom < top - 0.1, (top, bottom)


@pytest.mark.parametrize("saved, loaded, fresh", [
    ("TIMESTAMP", "STEP", 0), ("LFU", "STEP", 0), ("STEP", "LFU", 1), ("LFU", "LFU", None),
    ("STEP", "NO_EVICTION", None)],
    ids=["timestamp-to-step", "lfu-to-step", "step-to-lfu", "lfu-kept", "step-kept"])
def test_scores_of_another_score_strategy_load_fresh(tmp_path, caplog, saved, loaded, fresh):
    # A TIMESTAMP score (microseconds) read as a STEP score would outrank every step to
    # come: a row never looked up again would never be evicted.
    options = table_options(admission=False)
    table = _scored_table(100, dataclasses.replace(options, score_strategy=saved))
    path = save_checkpoint(str(tmp_path), 1, None, None, {"t": table})
    restored = HashTable(dataclasses.replace(options, score_strategy=loaded))
    with caplog.at_level("WARNING", logger="hashrec.checkpoint.table_io"):
        restore_checkpoint(path, None, None, {"t": restored})
    want, got = snapshot(table), snapshot(restored)
    assert torch.equal(got["keys"], want["keys"]) and torch.equal(got["rows"], want["rows"])
    if fresh is None:
        assert torch.equal(got["scores"], want["scores"]) and not caplog.text
    else:
        assert bool((got["scores"] == fresh).all())
        assert (f"table 't': rows saved under score_strategy {saved} load with fresh "
                f"{loaded} scores") in caplog.text


@pytest.mark.parametrize("strategy, check_mode", [("STEP", "WARNING"),
                                                  ("NO_EVICTION", "WARNING"),
                                                  ("NO_EVICTION", "ERROR")])
@pytest.mark.parametrize("capacity", [256, 608], ids=["cap256", "cap608"])
def test_a_restore_that_keeps_every_row_grows_past_max_capacity(tmp_path, caplog, capacity,
                                                                 strategy, check_mode):
    options = table_options(admission=False, max_capacity=4096)
    saved = _scored_table(600, options)
    path = save_checkpoint(str(tmp_path), 1, None, None, {"t": saved})
    small = HashTable(dataclasses.replace(options, max_capacity=capacity,
                                          score_strategy=strategy, check_mode=check_mode))
    with caplog.at_level("INFO", logger="hashrec.checkpoint.table_io"):
        meta = restore_checkpoint(path, None, None, {"t": small}, keep_every_row=True)
    assert meta["loaded"]["t"]["rows"] == 600 == int(small.size())
    assert small.capacity() >= 2 * capacity
    assert "WARNING" not in caplog.text  # neither rows lost nor inserts refused
    why = ("fewer slots than rows" if capacity < 600 else "the keys fill its buckets "
           "unevenly: another number of ranks or bucket_capacity than the checkpoint's")
    assert f"fit its {capacity} slots (max_capacity {capacity}; {why}); grown to " in caplog.text
    assert (f"grown to {small.capacity()} slots, past max_capacity, to hold every row "
            f"(nothing trains here): it holds 600") in caplog.text
    want, got = snapshot(saved), snapshot(small)
    order_want, order_got = want["keys"].argsort(), got["keys"].argsort()
    for field in ("keys", "rows", "scores"):
        assert torch.equal(got[field][order_got], want[field][order_want])


def test_a_no_eviction_table_too_small_is_an_error(tmp_path):
    options = table_options(admission=False, max_capacity=4096)
    path = save_checkpoint(str(tmp_path), 1, None, None, {"t": _scored_table(600, options)})
    small = HashTable(dataclasses.replace(options, max_capacity=256,
                                          score_strategy="NO_EVICTION"))
    with pytest.raises(CheckpointError, match=(
            r"table 't': 600 rows of .*/dynamicemb/t belong here but the table holds \d+ "
            r"\(room for 256\) and, with score_strategy NO_EVICTION, refused the other \d+ "
            r"in the order they were read; raise its max_capacity")):
        restore_checkpoint(path, None, None, {"t": small})


def _damage(path: str, target: str) -> str:
    shard = glob.glob(os.path.join(path, "dynamicemb", "t", "*.bin"))[0]
    if target == "truncated-shard":
        with open(shard, "r+b") as f:
            f.truncate(10)
        return r"rank-00000-of-00001\.bin.*truncated"
    if target == "corrupt-shard":
        with open(shard, "r+b") as f:
            f.seek(40)
            f.write(b"\xff\xff\xff\xff")
        return r"rank-00000-of-00001\.bin: checksum mismatch"
    if target == "missing-shard":
        os.remove(shard[:-4] + ".json")
        return r"rank-00000-of-00001\.json: missing"
    if target == "corrupt-model":
        with open(os.path.join(path, "model.pt"), "r+b") as f:
            f.seek(60)
            f.write(b"\x00\x01\x02")
        return r"model\.pt: checksum mismatch"
    if target == "truncated-meta":
        with open(os.path.join(path, "meta.json"), "r+b") as f:
            f.truncate(20)
        return r"meta\.json: unreadable or truncated"
    raise ValueError(target)


@pytest.mark.parametrize("target", ["truncated-shard", "corrupt-shard", "missing-shard",
                                    "corrupt-model", "truncated-meta"])
def test_damaged_checkpoint_names_the_file(tmp_path, target):
    model, optimizer = _dense(0)
    path = save_checkpoint(str(tmp_path), 1, model, optimizer, {"t": trained_table()})
    pattern = _damage(path, target)
    before = {p: os.path.getsize(p) for p in glob.glob(os.path.join(path, "**"), recursive=True)
              if os.path.isfile(p)}
    with pytest.raises(CheckpointError, match=pattern):
        restore_checkpoint(path, *_dense(1), {"t": HashTable(table_options())})
    after = {p: os.path.getsize(p) for p in before}
    assert after == before  # nothing rewritten by the failed restore


def test_a_torcheasyrec_checkpoint_is_named_as_one(tmp_path):
    # torch.distributed.checkpoint shards under model/, as TorchEasyRec saves a checkpoint
    path = tmp_path / "model.ckpt-10"
    (path / "model").mkdir(parents=True)
    for name in ("__0_0.distcp", ".metadata"):
        (path / "model" / name).write_bytes(b"\0")
    with pytest.raises(CheckpointError, match=r"model\.ckpt-10: holds torch\.distributed\."
                       r"checkpoint shards \(model/\*\.distcp\), as TorchEasyRec writes"):
        restore_checkpoint(str(path), *_dense(1), {"t": HashTable(table_options())})
    # its model_dir, as TorchEasyRec's --fine_tune_checkpoint takes it
    with pytest.raises(CheckpointError, match=rf"^{tmp_path} \(its model\.ckpt-10\): holds "
                                              r"torch\.distributed\.checkpoint shards"):
        restore_checkpoint(str(tmp_path), *_dense(1), {"t": HashTable(table_options())})


@pytest.mark.parametrize("options", [table_options(), adam_options()], ids=["adagrad", "adam"])
def test_continued_updates_equal_uninterrupted(tmp_path, options):
    uninterrupted = trained_table(steps=6, options=options)
    path = save_checkpoint(str(tmp_path), 6, None, None, {"t": uninterrupted})
    resumed = HashTable(options)
    restore_checkpoint(path, None, None, {"t": resumed})
    train_steps(uninterrupted, 7, 14)
    train_steps(resumed, 7, 14)
    assert_same(snapshot(resumed), snapshot(uninterrupted))


@pytest.mark.parametrize("init_capacity", [None, 32], ids=["at-max", "grown"])
@pytest.mark.parametrize("strategy", ["STEP", "LFU"])
def test_a_full_table_evicting_among_equal_scores_resumes_as_uninterrupted(
        tmp_path, strategy, init_capacity):
    # 6 buckets of 16 for about 64 keys a step: full buckets evict (and admission counters
    # are dropped and evicted) among equal scores from the second step on; an erase
    # leaves holes. The slot breaks those ties, so the restore puts entries back in theirs.
    options = dataclasses.replace(
        table_options(max_capacity=96), score_strategy=strategy, init_capacity=init_capacity,
        admission=AdmissionOptions(threshold=2, counter_capacity=192, counter_bucket_capacity=16))
    uninterrupted = trained_table(steps=10, options=options)
    keys, tags, _, _ = next(uninterrupted.export_state(8))
    uninterrupted.erase(keys[:3], tags[:3])
    stats = uninterrupted.stats()
    assert stats["evictions"] > 0 and stats["counter_evictions"] > 0
    path = save_checkpoint(str(tmp_path), 10, None, None, {"t": uninterrupted})
    resumed = HashTable(options)
    restore_checkpoint(path, None, None, {"t": resumed})
    assert_same(snapshot(resumed), snapshot(uninterrupted))
    for table in (uninterrupted, resumed):
        train_steps(table, 11, 20)
    assert_same(snapshot(resumed), snapshot(uninterrupted))
    assert torch.equal(resumed.storage.keys, uninterrupted.storage.keys)  # slot for slot


def _cuda_steps(table: HashTable, first: int, last: int) -> None:
    """``train_steps`` on a CUDA table (the Triton kernels, the fixed-size path at max)."""
    for step in range(first, last + 1):
        keys = batch_keys(step, 0).cuda()
        table.advance_step()
        result = table.lookup(keys, train=True)
        grads = gradients(keys.cpu(), step, table.dim).cuda()
        table.apply_gradients(result.slots, grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("strategy", ["STEP", "LFU"])
def test_a_full_cuda_table_resumes_as_uninterrupted(tmp_path, strategy):
    options = dataclasses.replace(
        table_options(max_capacity=96), score_strategy=strategy, device="cuda",
        admission=AdmissionOptions(threshold=2, counter_capacity=192, counter_bucket_capacity=16))
    uninterrupted = HashTable(options)
    _cuda_steps(uninterrupted, 1, 20)
    assert uninterrupted.stats()["evictions"] > 0
    path = save_checkpoint(str(tmp_path), 20, None, None, {"t": uninterrupted})
    resumed = HashTable(options)
    restore_checkpoint(path, None, None, {"t": resumed})
    for table in (uninterrupted, resumed):
        _cuda_steps(table, 21, 40)
    assert_same(snapshot(resumed), snapshot(uninterrupted))
    assert torch.equal(resumed.storage.keys, uninterrupted.storage.keys)


def test_rank_state_round_trip_and_other_world_sizes(tmp_path):
    table = trained_table()
    state = {"cpu": torch.get_rng_state(), "note": "x", "tables": {"t": torch.arange(3)}}
    path = save_checkpoint(str(tmp_path), 3, None, None, {"t": table}, rank_state=state)
    assert os.path.isfile(os.path.join(path, "rank_state", "rank-00000-of-00001.pt"))
    meta = restore_checkpoint(path, None, None, {"t": HashTable(table_options())},
                              read_rank_state=True)
    got = meta["rank_state"]
    assert torch.equal(got["cpu"], state["cpu"]) and got["note"] == "x"
    assert torch.equal(got["tables"]["t"], torch.arange(3))
    # Not asked for: not read.
    assert restore_checkpoint(path, None, None, {"t": HashTable(table_options())}
                              )["rank_state"] is None
    # No state saved: None.
    plain = save_checkpoint(str(tmp_path), 4, None, None, {"t": table})
    assert restore_checkpoint(plain, None, None, {"t": HashTable(table_options())},
                              read_rank_state=True)["rank_state"] is None


@pytest.mark.parametrize("damage, says", [
    ("truncated", r"\d+ bytes, meta.json says \d+ \(truncated or overwritten\)"),
    ("not-torch", r"\d+ bytes, meta.json says \d+ \(truncated or overwritten\)"),
    ("flipped", r"checksum mismatch \(file corrupted\)"),
    ("unrecorded", r"unreadable \(.*\)")], ids=["truncated", "not-torch", "flipped", "unrecorded"])
def test_a_damaged_rank_state_fails_only_a_restore_that_reads_it(tmp_path, damage, says):
    # "flipped" still loads as a torch file: only its checksum tells. "unrecorded": a
    # checkpoint whose meta.json has no checksums (older ones) is read as it is.
    table = trained_table()
    path = save_checkpoint(str(tmp_path), 3, None, None, {"t": table},
                           rank_state={"cpu": torch.get_rng_state()})
    file = os.path.join(path, "rank_state", "rank-00000-of-00001.pt")
    with open(file, "r+b") as f:
        if damage == "truncated":
            f.truncate(os.path.getsize(file) // 2)
        elif damage == "flipped":
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0xFF  # inside the generator state's bytes
            f.seek(0)
            f.write(data)
        else:
            f.write(b"not a torch file")
            f.truncate()
    if damage == "unrecorded":
        meta_file = os.path.join(path, "meta.json")
        with open(meta_file, encoding="utf-8") as f:
            meta = json.load(f)
        del meta["rank_state_files"]
        with open(meta_file, "w", encoding="utf-8") as f:
            json.dump(meta, f)
    restored = HashTable(table_options())
    meta = restore_checkpoint(path, None, None, {"t": restored})
    assert meta["rank_state"] is None and meta["loaded"]["t"]["rows"] == table.size()
    assert_same(snapshot(restored), snapshot(table))
    with pytest.raises(CheckpointError, match=rf"^{file}: {says}; it holds this "
                                              r"rank's random generator states for resuming: "
                                              r"restore it from a copy, or delete it"):
        restore_checkpoint(path, None, None, {"t": HashTable(table_options())},
                           read_rank_state=True)


def test_rank_state_of_another_world_size_is_not_read(tmp_path):
    from hashrec.checkpoint import restore as restore_module

    table = trained_table()
    path = save_checkpoint(str(tmp_path), 3, None, None, {"t": table},
                           rank_state={"cpu": torch.get_rng_state()})
    meta = {"world_size": 2}
    assert restore_module._read_rank_state(path, meta, 0, 1) is None
    assert restore_module._read_rank_state(path, {"world_size": 1}, 0, 1) is not None

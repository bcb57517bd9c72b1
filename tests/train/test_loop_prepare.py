"""The training step starts the next batch's id deduplication, and the next forward
uses it instead of deduplicating again."""

from __future__ import annotations

import pytest
from small_din import STEPS, generate_data, small_loop

from hashrec.embedding import collection as collection_module
from hashrec.train.loop import TrainLoop


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate_data(out, seed=4)
    return out


def _loop(data_dir, tmp_path) -> TrainLoop:
    return small_loop(tmp_path / "model")


def test_each_batch_is_deduplicated_once(data_dir, tmp_path, monkeypatch):
    in_forward, prepared = [], []
    real_dedup = collection_module.dedup_storages
    real_start = collection_module.start_dedup
    monkeypatch.setattr(collection_module, "dedup_storages",
                        lambda storages: in_forward.append(1) or real_dedup(storages))
    monkeypatch.setattr(collection_module, "start_dedup",
                        lambda storages, share=None: prepared.append(1) or real_start(storages, share))
    loop = _loop(data_dir, tmp_path)
    loop.session.model.train()
    loop.run_epoch(str(data_dir))
    assert loop.step == STEPS
    # Only the first batch is deduplicated in its forward; every step starts the next's.
    assert len(in_forward) == 1
    assert len(prepared) == STEPS


def test_training_collects_garbage_on_its_schedule(data_dir, tmp_path, monkeypatch):
    import gc

    from hashrec.train.collection_schedule import CollectionSchedule

    young = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect",
                        lambda *args: young.append(args) if args == (1,) else real(*args))
    loop = _loop(data_dir, tmp_path)
    loop.collections = CollectionSchedule(every=2)
    assert gc.isenabled()
    loop.run(str(data_dir))
    assert loop.step == STEPS and len(young) == STEPS // 2
    assert gc.isenabled() and gc.get_freeze_count() == 0

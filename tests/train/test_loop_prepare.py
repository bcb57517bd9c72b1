"""The training step starts the next batch's id deduplication, and the next forward
uses it instead of deduplicating again."""

from __future__ import annotations

import pytest
import torch
from small_din import STEPS, generate_data, small_loop, trained_state

from hashrec.distributed.process_group import DistContext
from hashrec.embedding import collection as collection_module
from hashrec.train.errors import TrainError
from hashrec.train.loop import PREPARE_AHEAD_ENV, TrainLoop


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
                        lambda storages, **kw: in_forward.append(1) or real_dedup(storages, **kw))
    monkeypatch.setattr(collection_module, "start_dedup",
                        lambda storages, share=None: prepared.append(1) or real_start(storages, share))
    loop = _loop(data_dir, tmp_path)
    loop.session.model.train()
    loop.run_epoch(str(data_dir))
    assert loop.step == STEPS
    # Only the first batch is deduplicated in its forward; every step starts the next's.
    assert len(in_forward) == 1
    assert len(prepared) == STEPS


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_preparing_two_batches_ahead_trains_the_same_model(data_dir, tmp_path, monkeypatch,
                                                          device):
    """HASHREC_PREPARE_AHEAD=2: a step starts the dedup of the batch after the next (at
    its end); every batch but the first is still deduplicated once, ahead, and the model
    trained is the same, bit for bit."""
    states, counts, late = [], [], []
    real_dedup = collection_module.dedup_storages
    real_prepare = collection_module.EmbeddingCollection.prepare
    real_forward = collection_module.EmbeddingCollection.forward
    forwards, loops = [], []

    def forward(self, kjt):
        forwards.append(1)
        return real_forward(self, kjt)

    def prepare(self, kjt):  # a prepare after this step's forward: at the step's end
        late[-1] = max(late[-1], len(forwards) - loops[-1].step)
        real_prepare(self, kjt)

    monkeypatch.setattr(collection_module.EmbeddingCollection, "prepare", prepare)
    monkeypatch.setattr(collection_module.EmbeddingCollection, "forward", forward)
    for ahead in ("1", "2"):
        in_forward = []
        forwards.clear()
        late.append(0)
        monkeypatch.setenv(PREPARE_AHEAD_ENV, ahead)
        monkeypatch.setattr(collection_module, "dedup_storages",
                            lambda storages, seen=in_forward, **kw: seen.append(1) or
                            real_dedup(storages, **kw))
        loops.append(small_loop(tmp_path / ahead / "model", device))
        loop = loops[-1]
        assert loop.prepare_ahead == int(ahead)
        loop.run(str(data_dir))
        assert loop.step == STEPS
        states.append(trained_state(loop))
        counts.append(len(in_forward))
    assert counts == [1, 1]
    assert late == [0, 1]  # two ahead: prepared at the end of the step, after its forward
    assert states[0].keys() == states[1].keys()
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name


def test_ranks_must_agree_on_preparing_ahead(data_dir, tmp_path, monkeypatch):
    """Preparing is a collective: a rank set to 2 while a peer runs 1 stops at once."""
    import dataclasses

    from hashrec.train import checkpoints
    from hashrec.train import loop as loop_module

    session = _loop(data_dir, tmp_path).session
    session.ctx = dataclasses.replace(session.ctx or DistContext(), world_size=2,
                                      backend="gloo")
    # The peer's value is 1: the smallest value is 1, the largest (minus the smallest
    # negated) 2.
    monkeypatch.setattr(loop_module, "min_over_ranks",
                        lambda value, ctx: min(value, 1 if value > 0 else -1))
    monkeypatch.setenv(PREPARE_AHEAD_ENV, "2")
    with pytest.raises(TrainError, match="differs between ranks"):
        TrainLoop(session, loop_module.LoopOptions(num_steps=1), checkpoints.Resume())
    monkeypatch.setenv(PREPARE_AHEAD_ENV, "1")
    assert TrainLoop(session, loop_module.LoopOptions(num_steps=1),
                     checkpoints.Resume()).prepare_ahead == 1


def test_prepare_ahead_must_be_one_or_two(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(PREPARE_AHEAD_ENV, "3")
    with pytest.raises(TrainError, match="expected 1 or 2"):
        _loop(data_dir, tmp_path)


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

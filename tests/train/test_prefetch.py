"""DevicePrefetcher: batches pass through in order on the CPU; upcoming shows the next."""

import threading
import time

import pytest
import torch

from hashrec.embedding import KeyedJaggedTensor
from hashrec.features.batch import Batch
from hashrec.train.prefetch import DevicePrefetcher, EpochInputs, _batch_tensors


def _batch(i):
    kjt = KeyedJaggedTensor.from_lengths(["f"], torch.tensor([i, i + 1]), torch.tensor([1, 1]))
    return Batch(kjt, dense={"d": torch.full((2, 1), float(i))},
                 labels={"clk": torch.tensor([0.0, 1.0])}, batch_size=2)


def test_cpu_batches_pass_through_in_order():
    out = list(DevicePrefetcher([_batch(i) for i in range(3)], torch.device("cpu")))
    assert [b.sparse.values().tolist() for b in out] == [[0, 1], [1, 2], [2, 3]]
    assert [b.dense["d"][0, 0].item() for b in out] == [0.0, 1.0, 2.0]


def test_empty_input_gives_no_batch():
    prefetcher = DevicePrefetcher([], torch.device("cpu"))
    assert list(prefetcher) == []
    assert prefetcher.upcoming() is None


def test_upcoming_is_the_batch_handed_out_next():
    prefetcher = DevicePrefetcher([_batch(i) for i in range(3)], torch.device("cpu"))
    seen = []
    for batch in prefetcher:
        following = prefetcher.upcoming()
        seen.append((batch.sparse.values()[0].item(),
                     None if following is None else following.sparse.values()[0].item()))
    assert seen == [(0, 1), (1, 2), (2, None)]


def test_batch_tensors_cover_every_tensor_of_the_batch():
    tensors = _batch(0)
    found = _batch_tensors(tensors)
    assert len(found) == 5  # values, lengths, offsets, one dense, one label


class _Loaders:
    """Fake per-epoch loaders that log when each epoch's iterator starts."""

    def __init__(self, fail_at=None):
        self.events = []
        self.threads = {}
        self.fail_at = fail_at

    def __call__(self, epoch):
        events = self.events
        self.threads[epoch] = threading.current_thread().name
        if epoch == self.fail_at:
            raise OSError(f"cannot start epoch {epoch}")

        def batches():
            for i in range(3):
                events.append(("batch", epoch, i))
                yield (epoch, i)

        class Loader:  # like a DataLoader: iter() starts the workers at once
            def __iter__(self):
                events.append(("start", epoch))
                return batches()

        return Loader()


def test_next_epoch_starts_while_the_current_one_trains():
    loaders = _Loaders()
    inputs = EpochInputs(loaders, ahead=True)
    first = inputs.epoch(0, more=True)
    deadline = time.monotonic() + 10
    while ("start", 1) not in loaders.events and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ("start", 1) in loaders.events  # started before epoch 0 is consumed
    assert threading.current_thread().name not in loaders.threads[1]
    assert next(first) == (0, 0)
    assert list(first) == [(0, 1), (0, 2)]
    assert list(inputs.epoch(1, more=False)) == [(1, 0), (1, 1), (1, 2)]
    assert [e for e in loaders.events if e[0] == "start"] == [("start", 0), ("start", 1)]
    inputs.close()


def test_epochs_give_the_same_batches_with_or_without_running_ahead():
    got = {}
    for ahead in (True, False):
        inputs = EpochInputs(_Loaders(), ahead=ahead)
        got[ahead] = [b for e in range(3) for b in inputs.epoch(e, more=e < 2)]
        inputs.close()
    assert got[True] == got[False]


def test_a_failed_start_ahead_raises_when_that_epoch_is_needed():
    inputs = EpochInputs(_Loaders(fail_at=1), ahead=True)
    assert list(inputs.epoch(0, more=True)) == [(0, 0), (0, 1), (0, 2)]
    with pytest.raises(OSError, match="cannot start epoch 1"):
        inputs.epoch(1, more=False)


def test_an_unused_epoch_is_replaced_when_the_loop_jumps():
    loaders = _Loaders()
    inputs = EpochInputs(loaders, ahead=True)
    list(inputs.epoch(0, more=True))
    assert list(inputs.epoch(5, more=False))[0] == (5, 0)  # not epoch 1's loader


def test_epoch_ahead_with_real_loader_workers(tmp_path):
    import os

    from hashrec.config import load_pipeline_config
    from hashrec.data import create_dataloader
    from hashrec.features import build_feature_set
    from hashrec.tools.gen_taobao_data import generate

    generate(str(tmp_path), num_rows=1500, num_files=2, seed=0, scale=0.01, quiet=True)
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    pipeline = load_pipeline_config(os.path.join(examples, "multi_tower_din_taobao.config"))
    features = build_feature_set(pipeline)

    def make(epoch):
        return create_dataloader(pipeline.data_config, features, str(tmp_path), "train",
                                 batch_size=512, num_workers=2, seed=epoch)

    got = {}
    for ahead in (True, False):
        inputs = EpochInputs(make, ahead=ahead)
        got[ahead] = [b.sparse["user_id"].values.tolist()
                      for e in range(2) for b in inputs.epoch(e, more=e < 1)]
        inputs.close()
    assert got[True] == got[False] and sum(len(v) for v in got[True]) == 3000


def test_epoch_started_ahead_uses_the_callers_cuda_device(monkeypatch):
    """A loader pins for the device current in the thread that starts it: the thread
    starting the next epoch takes the training thread's device (a rank's own GPU)."""
    current = threading.local()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(current, "device", 0))
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: setattr(current, "device", device))
    torch.cuda.set_device(1)
    seen = {}

    def make(epoch):
        seen[epoch] = torch.cuda.current_device()
        return [epoch]

    inputs = EpochInputs(make, ahead=True)
    assert list(inputs.epoch(0, more=True)) == [0]
    assert list(inputs.epoch(1, more=False)) == [1]
    assert seen == {0: 1, 1: 1}

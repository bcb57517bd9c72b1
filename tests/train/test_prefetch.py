"""DevicePrefetcher: batches pass through in order on the CPU; upcoming shows the next
(or, deeper, the one after)."""

from types import SimpleNamespace

import pytest
import torch

from hashrec.embedding import KeyedJaggedTensor
from hashrec.features.batch import Batch
from hashrec.train.prefetch import DevicePrefetcher, EpochStream, _batch_tensors


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


def test_a_deeper_prefetcher_shows_two_batches_ahead_and_keeps_the_order():
    prefetcher = DevicePrefetcher([_batch(i) for i in range(4)], torch.device("cpu"), depth=2)
    seen = []
    for batch in prefetcher:
        ahead = [prefetcher.upcoming(k) for k in (1, 2)]
        seen.append((batch.sparse.values()[0].item(),
                     *(None if b is None else b.sparse.values()[0].item() for b in ahead)))
    assert seen == [(0, 1, 2), (1, 2, 3), (2, 3, None), (3, None, None)]
    with pytest.raises(ValueError, match="1 to 2 batches ahead"):
        prefetcher.upcoming(3)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        DevicePrefetcher([], torch.device("cpu"), depth=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_deeper_prefetcher_on_the_gpu_hands_out_the_batches_copied():
    batches = [_batch(i).pin_memory() for i in range(5)]
    prefetcher = DevicePrefetcher(batches, torch.device("cuda"), depth=2)
    seen = []
    for batch in prefetcher:
        after = prefetcher.upcoming(2)
        assert batch.sparse.values().is_cuda
        seen.append((batch.sparse.values().tolist(), batch.dense["d"][0, 0].item(),
                     None if after is None else after.sparse.values().tolist()))
    assert seen == [([i, i + 1], float(i), [i + 2, i + 3] if i + 2 < 5 else None)
                    for i in range(5)]


def test_batch_tensors_cover_every_tensor_of_the_batch():
    tensors = _batch(0)
    found = _batch_tensors(tensors)
    assert len(found) == 5  # values, lengths, offsets, one dense, one label


class _Streams:
    """Fake ``EpochStream`` makers: epoch e holds batches (e, 0..2) and a filler; every
    rank trains ``steps`` batches per epoch."""

    def __init__(self, steps=3):
        self.made = []
        self.steps = steps

    def __call__(self, first, count):
        self.made.append((first, count))

        def items():
            epoch = first
            while count is None or epoch < first + count:
                yield from [(epoch, (epoch, 0)), (epoch, None), (epoch, (epoch, 1)),
                            (epoch, (epoch, 2))]
                epoch += 1

        return items(), 4, self.steps


def test_stream_hands_out_epochs_from_one_loader():
    make = _Streams()
    stream = EpochStream(make)
    got = [list(stream.epoch(e, last=3)) for e in range(3)]
    assert got == [[(e, 0), (e, 1), (e, 2)] for e in range(3)]
    assert make.made == [(0, 3)] and stream.steps == 3
    stream.close()


def test_stream_keeps_the_ranks_common_count():
    stream = EpochStream(_Streams(steps=2))
    assert list(stream.epoch(0)) == [(0, 0), (0, 1)]  # (0, 2) is beyond every rank's count
    assert list(stream.epoch(1)) == [(1, 0), (1, 1)]


def test_a_rank_with_a_spare_batch_leaves_out_its_partial_one_first():
    # Two loader workers in turn: worker 0 ends with the input's partial batch, worker 1
    # with a full one; every rank trains 3 batches, this one has 4.
    rows = [100, 100, 100, 1]
    batches = [SimpleNamespace(batch_size=n, at=i) for i, n in enumerate(rows)]
    order = [batches[0], batches[1], batches[3], batches[2]]  # the partial comes before

    def make(first, count, *own):
        return iter([(first, b) for b in order]), 4, 3, *own

    assert [b.at for b in EpochStream(lambda f, c: make(f, c, 4, 100)).epoch(0)] == [0, 1, 2]
    # without this rank's count, the first 3 are taken (as when no batch is spare)
    assert [b.at for b in EpochStream(lambda f, c: make(f, c)).epoch(0)] == [0, 1, 3]
    assert [b.at for b in EpochStream(lambda f, c: make(f, c, 3, 100)).epoch(0)] == [0, 1, 3]


def test_stream_restarts_after_a_jump_or_an_unfinished_epoch():
    make = _Streams()
    stream = EpochStream(make)
    assert list(stream.epoch(0)) == [(0, 0), (0, 1), (0, 2)]
    assert next(stream.epoch(4)) == (4, 0)  # a jump; epoch 4 left unfinished
    assert list(stream.epoch(5)) == [(5, 0), (5, 1), (5, 2)]
    assert make.made == [(0, None), (4, None), (5, None)]


def test_stream_out_of_step_readers_raise():
    stream = EpochStream(lambda first, count: (iter([(first, None), (first + 1, None)]), 2, 1))
    with pytest.raises(RuntimeError, match="out of step"):
        list(stream.epoch(0))


def test_stream_with_real_loader_workers_reads_as_per_epoch_loaders(tmp_path):
    import os

    from hashrec.config import load_pipeline_config
    from hashrec.data import create_dataloader
    from hashrec.features import build_feature_set
    from hashrec.tools.gen_taobao_data import generate

    generate(str(tmp_path), num_rows=1500, num_files=2, seed=0, scale=0.01, quiet=True)
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    pipeline = load_pipeline_config(os.path.join(examples, "multi_tower_din_taobao.config"))
    pipeline.data_config.shuffle = True
    features = build_feature_set(pipeline)

    def loader(**kwargs):
        return create_dataloader(pipeline.data_config, features, str(tmp_path), "train",
                                 batch_size=512, num_workers=2, **kwargs)

    def make(first, count):
        made = loader(seed=first, num_epochs=count, tag_epochs=True)
        readers = made.dataset.reader_batches(0, 2)
        assert readers == [2, 1]  # 1500 rows: worker 0 has a full and the partial batch
        return made, 2 * max(readers), sum(readers)

    stream = EpochStream(make)
    got = [[b.sparse["user_id"].values.tolist() for b in stream.epoch(e)] for e in range(2)]
    stream.close()
    want = [[b.sparse["user_id"].values.tolist() for b in loader(seed=e)] for e in range(2)]
    assert got == want and got[0] != got[1]
    assert [sum(map(len, epoch)) for epoch in got] == [1500, 1500]

"""prefetch_to_device: batches pass through in order on the CPU."""

import torch

from hashrec.embedding import KeyedJaggedTensor
from hashrec.features.batch import Batch
from hashrec.train.prefetch import _batch_tensors, prefetch_to_device


def _batch(i):
    kjt = KeyedJaggedTensor.from_lengths(["f"], torch.tensor([i, i + 1]), torch.tensor([1, 1]))
    return Batch(kjt, dense={"d": torch.full((2, 1), float(i))},
                 labels={"clk": torch.tensor([0.0, 1.0])}, batch_size=2)


def test_cpu_batches_pass_through_in_order():
    out = list(prefetch_to_device([_batch(i) for i in range(3)], torch.device("cpu")))
    assert [b.sparse.values().tolist() for b in out] == [[0, 1], [1, 2], [2, 3]]
    assert [b.dense["d"][0, 0].item() for b in out] == [0.0, 1.0, 2.0]


def test_empty_input_gives_no_batch():
    assert list(prefetch_to_device([], torch.device("cpu"))) == []


def test_batch_tensors_cover_every_tensor_of_the_batch():
    tensors = _batch(0)
    found = _batch_tensors(tensors)
    assert len(found) == 5  # values, lengths, offsets, one dense, one label

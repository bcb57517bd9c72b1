import os
import pickle

import numpy as np
import pytest
import torch
from torch.multiprocessing.reductions import init_reductions

from hashrec.config import load_pipeline_config
from hashrec.data import create_dataloader
from hashrec.data.transfer import BatchSender, _mappings, plan, unpack
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.features import build_feature_set
from hashrec.features.batch import Batch
from hashrec.tools.gen_taobao_data import generate

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _batch(seed: int, rows: int = 5, weighted: bool = False, bag: int | None = None) -> Batch:
    """Random batch; ``bag`` fixes every bag's size (then same-size batches pack alike)."""
    rng = np.random.default_rng(seed)
    lengths = torch.from_numpy(rng.integers(0, 4, size=2 * rows) if bag is None
                               else np.full(2 * rows, bag))
    values = torch.from_numpy(rng.integers(-2**62, 2**62, size=int(lengths.sum())))
    rand = lambda *shape: torch.from_numpy(rng.random(shape, dtype=np.float32))  # noqa: E731
    weights = rand(values.numel()) if weighted else None
    kjt = KeyedJaggedTensor(["a", "b"], values, lengths, weights)
    return Batch(kjt, {"price": rand(rows, 3)}, {"seq__w": rand(rows, 4, 1)},
                 {"clk": rand(rows)}, rows, {"req": ["x"] * rows})


def _same(a: Batch, b: Batch) -> None:
    ka, kb = a.sparse, b.sparse
    assert ka.keys() == kb.keys() and a.batch_size == b.batch_size
    assert a.reserved == b.reserved
    for x, y in [(ka.values(), kb.values()), (ka.lengths(), kb.lengths()),
                 (ka.offsets(), kb.offsets())]:
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert (ka.weights_or_none() is None) == (kb.weights_or_none() is None)
    if ka.weights_or_none() is not None:
        assert torch.equal(ka.weights(), kb.weights())
    assert ka.length_per_key() == kb.length_per_key()
    for key in ka.keys():
        assert ka[key].max_bag == kb[key].max_bag
    for group in ("dense", "sequence_dense", "labels"):
        ga, gb = getattr(a, group), getattr(b, group)
        assert list(ga) == list(gb)
        for name in ga:
            assert ga[name].dtype == gb[name].dtype and ga[name].shape == gb[name].shape
            assert torch.equal(ga[name], gb[name])


def _send(packed) -> Batch:
    init_reductions()  # torch's tensor pickling through shared memory, as in DataLoaders
    from multiprocessing.reduction import ForkingPickler
    return pickle.loads(ForkingPickler.dumps(packed))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_unpack_of_plan_rebuilds_the_batch(weighted):
    batch = _batch(0, weighted=weighted)
    layout, tensors = plan(batch)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8)
    for spec, tensor in zip(layout.specs(), tensors):
        buffer[spec.offset:spec.offset + spec.nbytes] = tensor.reshape(-1).view(torch.uint8)
    _same(unpack(buffer, layout, batch.reserved), batch)


def test_slots_are_reused_once_the_receiver_copied_them_out():
    sender = BatchSender(max_slots=2)
    received = []
    for seed in range(6):
        batch = _batch(seed, bag=2)
        received.append((_send(sender.pack(batch)), batch))
    assert len(sender._slots) == 1  # every batch was copied out before the next was packed
    received.append((_send(sender.pack(_batch(9, rows=50))), _batch(9, rows=50)))
    assert len(sender._slots) == 2  # a larger batch needs a larger slot
    for got, want in received:
        _same(got, want)
    sender.close()


def test_batches_held_in_flight_use_spare_slots_then_one_off_buffers():
    sender = BatchSender(max_slots=2)
    batches = [_batch(seed, rows=4) for seed in range(5)]
    packed = [sender.pack(b) for b in batches]
    assert [p.key is None for p in packed] == [False, False, True, True, True]
    for p, want in reversed(list(zip(packed, batches))):
        _same(_send(p), want)
    sender.close()


def test_received_batches_do_not_alias_reused_slots():
    sender = BatchSender(max_slots=1)
    first = _batch(1, bag=3)
    got = _send(sender.pack(first))
    _send(sender.pack(_batch(2, bag=3)))  # overwrites the only slot
    assert len(sender._slots) == 1
    _same(got, first)
    sender.close()


def test_retired_slots_are_dropped_by_the_receiver():
    sender = BatchSender(max_slots=2)
    for packed in [sender.pack(_batch(seed)) for seed in range(2)]:
        _send(packed)
    _mappings.drop_retired()
    held = len(_mappings)
    sender.close()
    _mappings.drop_retired()
    assert len(_mappings) == held - 2


@pytest.fixture(scope="module")
def taobao(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), num_rows=2500, num_files=2, seed=1, scale=0.01, row_group_size=600,
             quiet=True)
    return str(out)


def test_worker_batches_equal_main_process_batches(taobao):
    pipeline = load_pipeline_config(os.path.join(EXAMPLES,
                                                 "multi_tower_din_taobao_dynamicemb.config"))
    features = build_feature_set(pipeline)
    load = lambda workers: list(create_dataloader(  # noqa: E731
        pipeline.data_config, features, taobao, "train", batch_size=512, num_workers=workers))
    main, one_worker = load(0), load(1)
    assert len(main) == len(one_worker) == 5
    for got, want in zip(one_worker, main):
        _same(got, want)


def _unpacked(seed: int = 0) -> tuple[Batch, Batch]:
    """(a random batch, the same batch unpacked from a payload buffer)."""
    batch = _batch(seed, weighted=True)
    layout, tensors = plan(batch)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8)
    for spec, tensor in zip(layout.specs(), tensors):
        buffer[spec.offset:spec.offset + spec.nbytes] = tensor.reshape(-1).view(torch.uint8)
    return batch, unpack(buffer, layout, batch.reserved)


def _views_of(batch: Batch, buffer: torch.Tensor) -> bool:
    kjt = batch.sparse
    tensors = [kjt.values(), kjt.lengths(), kjt.weights()]
    tensors += [t for group in (batch.dense, batch.sequence_dense, batch.labels)
                for t in group.values()]
    return all(t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
               for t in tensors)


def test_an_unpacked_batch_moves_as_one_buffer():
    batch, unpacked = _unpacked()
    buffer, rebuild = unpacked.packed
    assert _views_of(unpacked, buffer)
    assert unpacked.to("cpu") is unpacked  # already there
    copy = buffer.clone()
    rebuilt = rebuild(copy)
    _same(rebuilt, batch)
    assert _views_of(rebuilt, copy) and rebuilt.packed[0] is copy
    moved = unpacked.to("meta")  # a device move: one buffer, the same layout
    assert moved.packed[0].device.type == "meta" and _views_of(moved, moved.packed[0])
    assert moved.sparse.values().shape == batch.sparse.values().shape
    assert moved.dense["price"].dtype == batch.dense["price"].dtype
    assert moved.sparse.length_per_key() == batch.sparse.length_per_key()


def test_a_batch_built_in_place_is_not_packed():
    assert _batch(0).packed is None
    assert _batch(0).to("cpu").packed is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_packed_batch_on_the_gpu_equals_the_batch():
    batch, unpacked = _unpacked(3)
    pinned = unpacked.pin_memory()  # the DataLoader's pin-memory step keeps it packed
    assert pinned.packed[0].is_pinned() and pinned.pin_memory() is pinned
    _same(pinned, batch)
    on_gpu = pinned.to("cuda", non_blocking=True)
    assert on_gpu.packed[0].is_cuda and _views_of(on_gpu, on_gpu.packed[0])
    _same(on_gpu.to("cpu"), batch)


def test_the_loader_hands_out_packed_batches(taobao):
    """Through the DataLoader (workers, and its pin-memory step where there is a GPU), a
    batch arrives packed, so the prefetcher moves it in one copy."""
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    pipeline.data_config.pin_memory = True  # pins where there is a GPU
    batches = list(create_dataloader(pipeline.data_config, build_feature_set(pipeline), taobao,
                                     "train", batch_size=512, num_workers=2))
    assert batches and all(b.packed is not None for b in batches)
    assert all(b.pin_memory() is b for b in batches if b.packed[0].is_pinned())


def test_a_hard_negative_mask_travels_packed_and_pinned():
    batch = _batch(0)
    hard = torch.tensor([[True, False], [False, False], [True, True], [False, True],
                         [True, False]])
    batch = Batch(batch.sparse, batch.dense, batch.sequence_dense, batch.labels,
                  batch.batch_size, batch.reserved, negatives=10, hard_negatives=hard)
    layout, tensors = plan(batch)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8)
    for spec, tensor in zip(layout.specs(), tensors):
        buffer[spec.offset:spec.offset + spec.nbytes] = tensor.reshape(-1).view(torch.uint8)
    unpacked = unpack(buffer, layout, batch.reserved)
    _same(unpacked, batch)
    assert unpacked.negatives == 10 and unpacked.hard_negatives.dtype == torch.bool
    assert torch.equal(unpacked.hard_negatives, hard)
    assert torch.equal(unpacked.packed[1](buffer.clone()).hard_negatives, hard)
    assert unpacked.hard_negatives.untyped_storage().data_ptr() == \
        buffer.untyped_storage().data_ptr()
    assert torch.equal(batch.to("cpu").hard_negatives, hard)
    assert batch.to("meta").hard_negatives.device.type == "meta"

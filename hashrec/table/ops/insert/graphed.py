"""``upsert_slots`` replayed from a CUDA graph, for fixed-size batches on CUDA.

An eager ``upsert_slots`` issues about a dozen launches (Triton kernels, the
sort's passes, allocations); at 1M keys the device waits on the host for the
first part of the call. ``GraphedUpsert`` runs the first call of each batch size
eagerly, compiles on a scratch copy of the index, captures the same sequence into
a CUDA graph on static input buffers, and from then on copies the keys and scores
into those buffers and replays the graph: two copies and one launch.

The graph holds the storage's tensors by address, so it is dropped and captured
anew whenever the storage's tensors change (growth). Results of a replay live in
the graph's static outputs and stay valid until the next call with the same
batch size; clone them to keep them longer.
"""

from __future__ import annotations

import torch

from hashrec.table.errors import TableError
from hashrec.table.ops.insert.upsert import UpsertResult, upsert_slots
from hashrec.table.storage import TableStorage


def _addresses(storage: TableStorage) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in (storage.keys, storage.tags, storage.digests,
                                        storage.scores, storage.values))


class GraphedUpsert:
    """``upsert_slots`` over one storage, captured per batch size (see the module docstring).

    Args:
        allow_evict: passed to every ``upsert_slots``.
        tagged: whether calls pass tags (a graph is captured for one of the two).
    """

    def __init__(self, allow_evict: bool, tagged: bool = False) -> None:
        self.allow_evict = bool(allow_evict)
        self.tagged = bool(tagged)
        self._graphs: dict[int, tuple] = {}
        self._addresses: tuple[int, ...] | None = None

    def __call__(self, storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                 scores: torch.Tensor) -> UpsertResult:
        """Same contract as ``upsert_slots(storage, keys, tags, scores, allow_evict)``."""
        if storage.device.type != "cuda":
            raise TableError(f"GraphedUpsert needs a CUDA storage, got {storage.device}")
        if (tags is not None) != self.tagged:
            raise ValueError(f"tags={'given' if tags is not None else None} does not match "
                             f"tagged={self.tagged}")
        if self._addresses != _addresses(storage):
            self._graphs.clear()
            self._addresses = _addresses(storage)
        n = keys.numel()
        entry = self._graphs.get(n)
        if entry is None:
            result = upsert_slots(storage, keys, tags, scores, self.allow_evict)
            self._graphs[n] = self._capture(storage, keys, tags, scores)
            return result
        graph, static_in, static_out = entry
        static_in[0].copy_(keys)
        static_in[1].copy_(scores)
        if tags is not None:
            static_in[2].copy_(tags)
        graph.replay()
        return static_out

    def _capture(self, storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                 scores: torch.Tensor) -> tuple:
        static_in = (keys.clone(), scores.clone(), tags.clone() if tags is not None else None)
        # Compile every kernel specialization the static buffers need on a scratch copy of
        # the index (launches that compile cannot be captured; the table stays untouched).
        scratch = TableStorage(storage.num_buckets, storage.bucket_capacity,
                               storage.keys.clone(), storage.tags.clone(),
                               storage.digests.clone(), storage.scores.clone(), storage.values)
        upsert_slots(scratch, static_in[0], static_in[2], static_in[1], self.allow_evict)
        del scratch
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            static_out = upsert_slots(storage, static_in[0], static_in[2], static_in[1],
                                      self.allow_evict)
        return graph, static_in, static_out

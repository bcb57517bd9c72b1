"""The (user, node) pairs a TDM retrieval scores, as one Batch gathered from rows parsed once.

A pair is the user's row with the node's ``attr_fields`` values in those columns
(``retrieval.PairScorer``). A feature's parse of a row reads that row's columns alone, so
a feature that reads only user columns gives a pair the user's row's output, and one that
reads only node columns the node's: a block's user rows are parsed once, the tree's nodes
once, and each level's pairs are gathered from them, on the scoring device, instead of a
table of every pair being built and parsed on the host. The gathered Batch equals the
parse of the pairs' table: the same keys in the same order, values, lengths, weights,
dense and sequence values.

Where a feature, or a sequence whose sub-features are parsed together, reads both user and
node columns, the pairs cannot be split this way (``feature_sides`` says None) and the
retrieval parses the pairs' table.

Example::

    user rows u0 (seq [7, 8]), u1 (seq [9]); nodes n0 (id 100), n1 (id 101)
    pairs (u1, n0), (u0, n1) -> seq bags [9], [7, 8]; id bags [100], [101]
"""

from __future__ import annotations

import pyarrow as pa
import torch

from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.features.batch import Batch
from hashrec.features.feature_set import FeatureSet


def feature_sides(feature_set: FeatureSet, node_columns: set[str]
                  ) -> tuple[list[str], list[str]] | None:
    """(features read from the user row, features read from the node), in feature order;
    None where a feature, or a sequence parsed together, reads columns of both sides (a
    feature of no column is the user's)."""
    reads_node: dict[str, set[bool]] = {}
    for feature in feature_set.features.values():
        # the sub-features of one sequence are parsed together (``parse_sequence``)
        unit = feature.sequence_name if feature.is_sequence and \
            feature.sequence_name != feature.name else feature.name
        reads_node.setdefault(unit, set()).update(c in node_columns for c in feature.columns)
    if any(len(sides) > 1 for sides in reads_node.values()):
        return None
    user, node = [], []
    for feature in feature_set.features.values():
        unit = feature.sequence_name if feature.is_sequence and \
            feature.sequence_name != feature.name else feature.name
        (node if True in reads_node[unit] else user).append(feature.name)
    return user, node


def parse_side(feature_set: FeatureSet, names: list[str], table: pa.Table) -> Batch:
    """The features ``names`` of ``feature_set`` parsed from ``table`` (their columns), no
    labels."""
    part = FeatureSet([feature_set.features[n] for n in names], [], [])
    return part.parse(table.select(part.feature_columns), with_labels=False)


class PairBatches:
    """Batches of (user, node) pairs gathered from the parsed user and node rows.

    Args:
        feature_set: the model's features (the order of the Batch's keys).
        users: the user-side features of the block's rows (``parse_side``).
        nodes: the node-side features of every node of the tree (``parse_side``).
        device: where the pairs are gathered (the scorer's).
    """

    def __init__(self, feature_set: FeatureSet, users: Batch, nodes: Batch,
                 device: torch.device) -> None:
        users, nodes = users.to(device), nodes.to(device)
        self.keys = feature_set.sparse_keys()
        weighted = any(f.weighted for f in feature_set.features.values() if f.is_sparse)
        sides = [users, nodes]
        # every side's bags one after the other: side s's key k, row r is bag
        # first[s] + k * rows[s] + r
        kjts = [side.sparse for side in sides]
        rows = [side.batch_size for side in sides]
        first = [0, len(kjts[0].keys()) * rows[0]]
        self._values = torch.cat([k.values() for k in kjts])
        self._lengths = torch.cat([k.lengths() for k in kjts])
        self._offsets = torch.cat([self._lengths.new_zeros(1), self._lengths.cumsum(0)])
        self._weights = torch.cat([
            k.weights_or_none() if k.weights_or_none() is not None
            else torch.ones(k.values().shape, dtype=torch.float32, device=device)
            for k in kjts]) if weighted else None
        base, side_of = [], []
        for key in self.keys:
            side = 0 if key in kjts[0].keys() else 1
            base.append(first[side] + kjts[side].keys().index(key) * rows[side])
            side_of.append(side)
        self._base = torch.tensor(base, dtype=torch.int64, device=device)
        self._user_key = torch.tensor(side_of, device=device) == 0
        self._dense = [(name, side, values) for side, batch in enumerate(sides)
                       for name, values in batch.dense.items()]
        self._sequence_dense = [(name, side, values) for side, batch in enumerate(sides)
                                for name, values in batch.sequence_dense.items()]
        self._dense_order = list(feature_set.dense_features())
        self._sequence_order = list(feature_set.sequence_dense_features())

    def batch(self, user_index: torch.Tensor, node_rows: torch.Tensor) -> Batch:
        """The Batch of the pairs (``user_index[i]``, ``node_rows[i]``), (M,) int64 each:
        rows into the block's users and the tree's nodes."""
        pairs = len(user_index)
        rows = torch.where(self._user_key[:, None], user_index[None, :], node_rows[None, :])
        bags = (self._base[:, None] + rows).reshape(-1)
        lengths = self._lengths[bags]
        per_key = lengths.view(len(self.keys), pairs)
        host = torch.cat([per_key.sum(1), per_key.amax(1) if pairs else
                          per_key.new_zeros(len(self.keys))]).tolist()
        at = _positions(self._offsets[bags], lengths, sum(host[:len(self.keys)]))
        sparse = KeyedJaggedTensor(
            self.keys, self._values[at], lengths,
            None if self._weights is None else self._weights[at], validate=False)
        bounds = [0]
        for size in host[:len(self.keys)]:
            bounds.append(bounds[-1] + size)
        sparse.set_host_layout((bounds, host[len(self.keys):]))
        index = (user_index, node_rows)
        dense = {name: values.index_select(0, index[side])
                 for name, side, values in self._dense}
        sequence = {name: values.index_select(0, index[side])
                    for name, side, values in self._sequence_dense}
        return Batch(sparse, {n: dense[n] for n in self._dense_order},
                     {n: sequence[n] for n in self._sequence_order}, {}, pairs)


def _positions(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """(total,) the positions of bags (``starts``, ``lengths``) one after the other: a
    running sum of steps of 1 but at each bag's first value, where it jumps from the last
    bag's end to the bag's start (one array of ``total`` made, where ``repeat_interleave``
    and ``arange`` make three)."""
    kept = lengths > 0
    starts, lengths = starts[kept], lengths[kept]
    jumps = starts.clone()
    jumps[1:] -= starts[:-1] + lengths[:-1] - 1
    steps = torch.ones(total, dtype=torch.int64, device=starts.device)
    steps[lengths.cumsum(0) - lengths] = jumps
    return steps.cumsum_(0)

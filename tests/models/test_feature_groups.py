"""SEQUENCE groups: lengths over sequence features of different lengths, and the warning
when a group mixes sequences."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from google.protobuf import text_format
from model_fakes import SEQUENCES, FakeEmbedding, FakeFeatureSet, make_batch, model_config

from hashrec.config import model_pb2, parse_pipeline_config
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.features import build_feature_set
from hashrec.features.batch import Batch
from hashrec.models import MultiTowerDIN
from hashrec.models.feature_groups import (
    SEQUENCE,
    FeatureInfo,
    GroupSpec,
    build_group_spec,
    feature_infos,
    sequence_input,
)

LOGGER = "hashrec.models.feature_groups"


def mixed_group() -> GroupSpec:
    """A query, two id sequences of different sequences, a raw sequence of the first."""
    return GroupSpec("seq", SEQUENCE, query=(FeatureInfo("item", 2, True, False),),
                     sequence=(FeatureInfo("click__item", 2, True, True, "click"),
                               FeatureInfo("buy__item", 2, True, True, "buy"),
                               FeatureInfo("click__price", 1, False, True, "click")))


def mixed_inputs() -> tuple[SimpleNamespace, SimpleNamespace]:
    """click padded to 3 items, buy to 5; each row's ids are zero past its length."""
    click_lengths, buy_lengths = torch.tensor([3, 0, 1, 2]), torch.tensor([1, 4, 0, 5])
    click = torch.randn(4, 3, 2) * (torch.arange(3) < click_lengths[:, None])[..., None]
    buy = torch.randn(4, 5, 2) * (torch.arange(5) < buy_lengths[:, None])[..., None]
    embedded = SimpleNamespace(pooled={"item": torch.randn(4, 2)},
                               sequences={"click__item": (click, click_lengths),
                                          "buy__item": (buy, buy_lengths)})
    batch = SimpleNamespace(dense={}, sequence_dense={"click__price": torch.randn(4, 3, 1)})
    return embedded, batch


def test_sequence_lengths_are_the_longest_sequence_per_row():
    torch.manual_seed(0)
    embedded, batch = mixed_inputs()
    query, sequence, lengths = sequence_input(mixed_group(), embedded, batch)
    assert query.shape == (4, 2) and sequence.shape == (4, 5, 5)
    assert lengths.tolist() == [3, 4, 1, 5]
    click, _ = embedded.sequences["click__item"]
    assert torch.equal(sequence[:, :3, :2], click)
    assert not sequence[:, 3:, :2].any() and not sequence[:, 3:, 4:].any()


def _with_item(batch: Batch, feature: str, row: int, position: int) -> Batch:
    """``batch`` with another id at ``position`` of ``feature``'s sequence in ``row``."""
    kjt = batch.sparse
    values = kjt.values().clone()
    bag = kjt.keys().index(feature) * batch.batch_size + row
    index = int(kjt.offsets()[bag]) + position
    values[index] = (values[index] + 1) % 50
    changed = KeyedJaggedTensor.from_lengths(kjt.keys(), values, kjt.lengths())
    return Batch(changed, dense=batch.dense, labels=batch.labels, batch_size=batch.batch_size)


@pytest.mark.parametrize("shorter", [0, 1], ids=["first-shorter", "second-shorter"])
def test_din_attends_over_the_items_of_the_longer_sequence(shorter):
    short, long = SEQUENCES[shorter], SEQUENCES[1 - shorter]
    features = FakeFeatureSet(sequence_of={short: "click_seq", long: "buy_seq"})
    torch.manual_seed(0)
    model = MultiTowerDIN(model_config(), features, None, embedding=FakeEmbedding())
    model.eval()
    batch = make_batch(2, feature_lengths={short: [1, 1], long: [4, 4]})
    # row 0's third item of the longer sequence lies past the shorter one's length
    changed = _with_item(batch, long, row=0, position=2)
    with torch.no_grad():
        before, after = model(batch)["logits"], model(changed)["logits"]
    assert (before[0] - after[0]).abs() > 1e-6
    assert torch.equal(before[1], after[1])


FEATURES = """
feature_configs { id_feature { feature_name: "item" expression: "item:item" embedding_dim: 4
  num_buckets: 50 } }
feature_configs { sequence_feature { sequence_name: "click" sequence_length: 5 sequence_delim: "|"
  features { id_feature { feature_name: "item" expression: "item:item" embedding_dim: 4 } }
  features { raw_feature { feature_name: "price" expression: "item:price" } } } }
feature_configs { sequence_id_feature { feature_name: "buy" expression: "user:buy"
  embedding_dim: 4 num_buckets: 50 sequence_length: 3 } }
feature_configs { sequence_id_feature { feature_name: "cart" expression: "user:cart"
  embedding_dim: 4 num_buckets: 50 sequence_length: 3 } }
"""


def _build_group(*sequence_features: str) -> GroupSpec:
    infos = feature_infos(build_feature_set(parse_pipeline_config(f'model_dir: "m"\n'
                                                                  f'{FEATURES}')))
    names = ", ".join(f'"{n}"' for n in ("item", *sequence_features))
    group = text_format.Parse(f'group_name: "seq" group_type: SEQUENCE feature_names: [{names}]',
                              model_pb2.FeatureGroupConfig())
    return build_group_spec(group, infos)


@pytest.mark.parametrize("features,warned", [
    (("click__item", "click__price"), None),
    (("click__item", "buy", "click__price"), "click: click__item, click__price; buy: buy"),
    (("buy", "cart"), "buy: buy; cart: cart"),
], ids=["one-sequence-feature", "sequence-feature-and-top-level", "two-top-level"])
def test_a_group_mixing_sequences_warns(caplog, features, warned):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        group = _build_group(*features)
    assert [f.sequence for f in group.sequence] == [f.split("__")[0] for f in features]
    if warned is None:
        assert not caplog.records
    else:
        (record,) = caplog.records
        assert f"'seq' mixes features of 2 sequences ({warned})" in record.getMessage()
        assert "paired position by position" in record.getMessage()

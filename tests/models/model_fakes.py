"""Synthetic stand-ins for a FeatureSet and an embedding collection (model unit tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from google.protobuf import text_format
from torch import nn

from hashrec.config import model_pb2
from hashrec.embedding.jagged import KeyedJaggedTensor
from hashrec.embedding.specs import EmbeddingFeatureSpec
from hashrec.features.batch import Batch
from hashrec.models import create_model

DIM = 4
WIDE_DIM = 2
SEQ_LEN = 5
POOLED = ("user_id", "item_id", "cate_id")
SEQUENCES = ("click_seq__item_id", "click_seq__cate_id")

MODEL_CONFIG = """
feature_groups { group_name: "deep" feature_names: ["user_id", "item_id", "cate_id", "price"]
                 group_type: DEEP }
feature_groups { group_name: "seq" feature_names: ["item_id", "cate_id",
                 "click_seq__item_id", "click_seq__cate_id"] group_type: SEQUENCE }
multi_tower_din {
  towers { input: "deep" mlp { hidden_units: [8, 4] } }
  din_towers { input: "seq" attn_mlp { hidden_units: [8] } }
  final { hidden_units: [4] }
}
losses { binary_cross_entropy {} }
metrics { auc {} }
"""


def model_config(text: str = MODEL_CONFIG) -> model_pb2.ModelConfig:
    return text_format.Parse(text, model_pb2.ModelConfig())


def fake_model(text: str, wide: tuple[str, ...] = (), labels: tuple[str, ...] = ("clk",),
               weights: tuple[str, ...] = ()):
    """The registry's model of ``text`` on the fakes (seeded), ``wide`` features having
    wide embeddings, ``labels`` the label fields, ``weights`` the sample weight fields."""
    torch.manual_seed(0)
    features = FakeFeatureSet(list(labels), wide=wide, sample_weight_fields=weights)
    return create_model(model_config(text), features, None,
                        embedding=FakeEmbedding(wide=wide))


@dataclass
class FakeFeatureSet:
    label_fields: list[str] = field(default_factory=lambda: ["clk"])
    # sequence feature -> the sequence it reads (sub-features of one sequence_feature)
    sequence_of: dict[str, str] = field(
        default_factory=lambda: dict.fromkeys(SEQUENCES, "click_seq"))
    left_out: tuple[str, ...] = ()
    # pooled features with a wide embedding ``<name>@wide`` (WIDE_DIM columns) besides
    wide: tuple[str, ...] = ()
    # data_config.sample_weight_fields
    sample_weight_fields: tuple[str, ...] = ()

    def embedding_features(self):
        return ([EmbeddingFeatureSpec(n, n) for n in POOLED]
                + [EmbeddingFeatureSpec(n, n, is_sequence=True, max_length=SEQ_LEN)
                   for n in SEQUENCES]
                + [EmbeddingFeatureSpec(f"{n}@wide", f"{n}_wide", key=n) for n in self.wide])

    def embedding_tables(self):
        return []

    def dense_features(self):
        return {"price": 1}

    def sequence_dense_features(self):
        return {}

    def sequence_names(self):
        return dict(self.sequence_of)

    def output_dim(self, name):
        if name.endswith("@wide"):
            return WIDE_DIM
        return 1 if name == "price" else DIM


@dataclass
class FakeOutput:
    pooled: dict
    sequences: dict


class FakeEmbedding(nn.Module):
    """One trainable nn.Embedding per feature (and per wide embedding ``<name>@wide`` of
    the ``wide`` features, in table ``<name>_wide``), sum pooling, padded sequences."""

    def __init__(self, num_rows: int = 50, pad_noise: float = 0.0,
                 wide: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.pad_noise = pad_noise
        self.wide = wide
        self.tables = nn.ModuleDict({n: nn.Embedding(num_rows, DIM) for n in POOLED + SEQUENCES})
        self.tables.update({f"{n}_wide": nn.Embedding(num_rows, WIDE_DIM) for n in wide})

    @staticmethod
    def _pooled(table: nn.Embedding, bags) -> torch.Tensor:
        rows = torch.repeat_interleave(torch.arange(bags.lengths.numel()), bags.lengths)
        out = torch.zeros(bags.lengths.numel(), table.embedding_dim)
        return out.index_add(0, rows, table(bags.values))

    def forward(self, kjt: KeyedJaggedTensor) -> FakeOutput:
        pooled, sequences = {}, {}
        for name in POOLED:
            pooled[name] = self._pooled(self.tables[name], kjt[name])
        for name in self.wide:
            pooled[f"{name}@wide"] = self._pooled(self.tables[f"{name}_wide"], kjt[name])
        for name in SEQUENCES:
            bags = kjt[name]
            ids = bags.to_padded(SEQ_LEN)
            mask = torch.arange(SEQ_LEN) < bags.lengths.unsqueeze(1)
            padded = self.tables[name](ids) * mask.unsqueeze(-1)
            noise = torch.randn(padded.shape) * self.pad_noise * (~mask).unsqueeze(-1)
            sequences[name] = (padded + noise, bags.lengths)
        return FakeOutput(pooled, sequences)


def make_batch(batch_size: int = 6, seed: int = 0, lengths=None,
               feature_lengths: dict | None = None, more_labels: tuple[str, ...] = ()) -> Batch:
    """Random ids; every sequence feature has ``lengths`` (random if None) unless
    ``feature_lengths`` gives its own; random 0/1 labels ``clk`` and ``more_labels``."""
    gen = torch.Generator().manual_seed(seed)
    values, all_lengths = [], []
    for _ in POOLED:
        values.append(torch.randint(0, 50, (batch_size,), generator=gen))
        all_lengths.append(torch.ones(batch_size, dtype=torch.int64))
    seq_lengths = (torch.tensor(lengths) if lengths is not None
                   else torch.randint(0, SEQ_LEN + 1, (batch_size,), generator=gen))
    for name in SEQUENCES:
        own = torch.as_tensor((feature_lengths or {}).get(name, seq_lengths))
        values.append(torch.randint(0, 50, (int(own.sum()),), generator=gen))
        all_lengths.append(own)
    kjt = KeyedJaggedTensor.from_lengths(list(POOLED + SEQUENCES), torch.cat(values),
                                         torch.cat(all_lengths))
    labels = {"clk": torch.randint(0, 2, (batch_size,), generator=gen).float()}
    dense = {"price": torch.rand(batch_size, 1, generator=gen)}
    for name in more_labels:
        labels[name] = torch.randint(0, 2, (batch_size,), generator=gen).float()
    return Batch(kjt, dense=dense, labels=labels, batch_size=batch_size)


def train_one_batch(model, batch_size: int = 6) -> None:
    """One forward and backward on a random batch: (B,) logits, a loss that is the binary
    cross-entropy of the probabilities, a gradient on every dense parameter."""
    batch = make_batch(batch_size)
    predictions = model(batch)
    assert predictions["logits"].shape == (batch_size,)
    p, y = predictions["probs"], batch.labels["clk"]
    loss = model.loss(predictions, batch)["binary_cross_entropy"]
    assert torch.allclose(loss, -(y * p.log() + (1 - y) * (1 - p).log()).mean(), atol=1e-5)
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters()
               if not n.startswith("embedding"))

"""Embedding layer: jagged inputs, embedding collections over dense and dynamic tables."""

from hashrec.embedding.collection import EmbeddingCollection
from hashrec.embedding.dense_table import DenseTable
from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.jagged import JaggedError, JaggedTensor, KeyedJaggedTensor
from hashrec.embedding.output import EmbeddingOutput
from hashrec.embedding.specs import EmbeddingFeatureSpec, EmbeddingTableSpec

__all__ = [
    "DenseTable",
    "EmbeddingCollection",
    "EmbeddingError",
    "EmbeddingFeatureSpec",
    "EmbeddingOutput",
    "EmbeddingTableSpec",
    "JaggedError",
    "JaggedTensor",
    "KeyedJaggedTensor",
]

"""Embedding layer: jagged inputs, embedding collections over dense and dynamic tables."""

from hashrec.embedding.jagged import JaggedError, JaggedTensor, KeyedJaggedTensor

__all__ = ["JaggedError", "JaggedTensor", "KeyedJaggedTensor"]

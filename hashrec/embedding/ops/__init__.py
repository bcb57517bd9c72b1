"""Embedding-layer kernel ops, one folder per op.

Each op folder holds ``reference.py`` (pure PyTorch: the CPU path and the test
oracle) and, when written, ``triton.py`` with the same functions for CUDA
tensors. The op's ``__init__.py`` picks the backend by the device of its input
(``hashrec.table.ops.dispatch.backend``: CUDA -> triton when importable).
"""

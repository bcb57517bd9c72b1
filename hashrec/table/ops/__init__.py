"""Table kernels, one folder per op: ``reference.py`` (PyTorch) and ``triton.py`` (CUDA).

Each op's ``__init__`` picks the backend by device: CUDA tensors go to ``triton``
when that module can be imported, everything else to ``reference``.
"""

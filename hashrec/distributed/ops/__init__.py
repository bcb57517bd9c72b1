"""Device ops of the sharded lookups (reference in PyTorch, Triton on CUDA)."""

"""Suite-wide test settings."""

import torch

# pytest-xdist runs one worker per core; a multi-threaded intra-op pool per worker
# oversubscribes the cores, and small parallel ops then wait on thread barriers.
torch.set_num_threads(1)


def pytest_runtest_setup(item):  # noqa: ARG001 - the pytest hook's signature
    """Interpreted kernels patch triton.language once a launch, not once a helper call
    (``interpreter_patch_once``). Installed from the first test on: Triton must be imported
    after the test modules chose TRITON_INTERPRET."""
    import sys
    if "triton" in sys.modules:
        import interpreter_patch_once
        interpreter_patch_once.install()

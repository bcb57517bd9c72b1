"""Suite-wide test settings."""

import torch

# pytest-xdist runs one worker per core; a multi-threaded intra-op pool per worker
# oversubscribes the cores, and small parallel ops then wait on thread barriers.
torch.set_num_threads(1)

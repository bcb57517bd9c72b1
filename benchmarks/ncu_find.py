"""One find_values of 1M keys (60% present) from 64M slots at a load factor, for a
counter profile of the find kernel: ``ncu --kernel-name regex:_find_kernel
--launch-skip 2 --launch-count 1 python ncu_find.py --load-factor 0.5`` (the first
calls compile and are left out)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table_fill import filled_index, random_keys  # noqa: E402

from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--load-factor", type=float, default=0.5)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args()
    device = torch.device("cuda")
    index, stored = filled_index(1 << 26, args.load_factor, device)
    storage = TableStorage.empty(index.num_buckets, index.bucket_capacity, args.dim,
                                 device=device)
    storage.keys.copy_(index.keys)
    storage.digests.copy_(index.digests)
    n = 1 << 20
    present = stored[torch.randint(0, stored.numel(), (int(n * 0.6),), device=device)]
    batch = torch.cat([present, random_keys(n - present.numel(), device)])
    batch = batch[torch.randperm(n, device=device)]
    for _ in range(args.calls):
        find_tt.find_values(storage, batch, None, args.dim)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

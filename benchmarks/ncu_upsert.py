"""One insert_or_assign of 1M keys (60% present) into 64M slots at a load factor, for a
counter profile of its kernels: ``ncu --kernel-name regex:upsert python ncu_upsert.py``
(``--lanes 1`` for the lane form). The first call compiles and is left out with
``--launch-skip``."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table_fill import filled_index, random_keys  # noqa: E402

from hashrec.table.ops.insert import upsert  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--load-factor", type=float, default=0.5)
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--lanes", type=int, default=None,
                   help="1: the lane form first, 0: the block form alone (default: the "
                        "library's)")
    p.add_argument("--maxnreg", type=int, default=None,
                   help="the block form's register cap (default: the library's)")
    args = p.parse_args()
    for name, value in (("lanes", args.lanes), ("maxnreg", args.maxnreg)):
        if value is not None:
            upsert.UPSERT_BLOCK[name] = value
    device = torch.device("cuda")
    storage, stored = filled_index(1 << 26, args.load_factor, device)
    for _ in range(args.calls):
        n = 1 << 20
        present = stored[torch.randint(0, stored.numel(), (int(n * 0.6),), device=device)]
        batch = torch.cat([present, random_keys(n - present.numel(), device)])
        upsert.upsert_slots(storage, batch, None, torch.ones_like(batch), allow_evict=True)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

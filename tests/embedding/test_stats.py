"""Per-tag device sums of the lookup counters: the Triton kernel (interpreted on CPU) and
the torch reference against index_add_."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hashrec.embedding.ops.stats import reference  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _impls():
    pytest.importorskip("triton", reason="triton is not installed")
    from hashrec.embedding.ops.stats import triton as kernel

    return [reference, kernel]


@pytest.mark.parametrize("n", [9, 1500, 3000])
def test_unstored_by_tag_match_index_add_with_tags_read_or_not(n):
    """Tags ascend with gaps (unread tables); blocks of the kernel span several tags."""
    gen = torch.Generator().manual_seed(n)
    tags = torch.randint(0, 7, (n,), generator=gen, dtype=torch.int32)
    tags[tags == 3] = 4  # tags 1 (maybe) and 3 unread
    tags = tags.sort().values
    slots = torch.randint(-1, 50, (n,), generator=gen) * torch.randint(0, 2, (n,), generator=gen)
    slots[slots == 0] = -1  # about half not stored
    start = torch.randint(0, 100, (7,), generator=gen)
    expected = start - torch.zeros(7, dtype=torch.int64).index_add_(0, tags.long(),
                                                                     (slots < 0).long())
    for impl in _impls():
        sums = start.clone().to(DEVICE)
        impl.take_unstored_by_tag(sums, slots.to(DEVICE), tags.to(DEVICE))
        assert torch.equal(sums.cpu(), expected), impl.__name__
        empty = torch.empty(0, dtype=torch.int32, device=DEVICE)
        impl.take_unstored_by_tag(sums, empty.long(), empty)
        assert torch.equal(sums.cpu(), expected), impl.__name__

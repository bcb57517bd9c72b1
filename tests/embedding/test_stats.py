"""Per-tag device sums of the lookup counters."""

import torch

from hashrec.embedding.stats import _sums_by_tag


def test_sums_by_tag_match_index_add_with_tags_read_or_not():
    gen = torch.Generator().manual_seed(3)
    tags = torch.tensor([0, 0, 0, 2, 2, 5, 5, 5, 5], dtype=torch.int32)  # 1, 3, 4 unread
    values = torch.randint(-1, 1, (tags.numel(),), generator=gen)
    expected = torch.zeros(7, dtype=torch.int64).index_add_(0, tags, values)
    assert torch.equal(_sums_by_tag(values, tags, 7), expected)
    empty = torch.empty(0, dtype=torch.int32)
    assert torch.equal(_sums_by_tag(empty.long(), empty, 3), torch.zeros(3, dtype=torch.int64))

"""Shared by the Triton table-op tests: random keys, storages filled through the
reference insert, and index comparisons."""

from __future__ import annotations

import torch

from hashrec.table.ops.insert import reference as insert_ref
from hashrec.table.storage import TableStorage

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def edge_keys() -> torch.Tensor:
    return torch.tensor([0, 1, -1, INT64_MIN, INT64_MAX, INT64_MIN + 1, 12345678901234567],
                        dtype=torch.int64)


def random_keys(n: int, gen: torch.Generator) -> torch.Tensor:
    keys = torch.randint(INT64_MIN, INT64_MAX, (n,), dtype=torch.int64, generator=gen)
    keys = torch.unique(torch.cat([edge_keys(), keys]))
    return keys[torch.randperm(keys.numel(), generator=gen)]


def filled(num_buckets: int, cap: int, n: int, seed: int, tagged: bool = False,
           row_dim: int = 4, dtype: torch.dtype = torch.float32
           ) -> tuple[TableStorage, torch.Tensor, torch.Tensor | None]:
    """A storage (rows in ``dtype``) filled through the reference insert, plus the keys
    (and tags) offered."""
    gen = torch.Generator().manual_seed(seed)
    storage = TableStorage.empty(num_buckets, cap, row_dim, dtype, device=DEVICE)
    keys = random_keys(n, gen)
    tags = torch.randint(0, 3, keys.shape, dtype=torch.int32, generator=gen) if tagged else None
    scores = torch.randint(0, 5, keys.shape, dtype=torch.int64, generator=gen)
    storage.values.copy_(torch.randn(storage.values.shape, generator=gen))
    insert_ref.insert_keys(storage, keys.to(DEVICE), None if tags is None else tags.to(DEVICE),
                           scores.to(DEVICE), allow_evict=True)
    return storage, keys.to(DEVICE), None if tags is None else tags.to(DEVICE)


def clone(storage: TableStorage) -> TableStorage:
    return TableStorage(storage.num_buckets, storage.bucket_capacity, storage.keys.clone(),
                        storage.tags.clone(), storage.digests.clone(), storage.scores.clone(),
                        storage.values.clone())


def assert_same_index(a: TableStorage, b: TableStorage) -> None:
    assert torch.equal(a.digests, b.digests)
    occ = a.digests != 0
    for name in ("keys", "tags", "scores"):
        assert torch.equal(getattr(a, name)[occ], getattr(b, name)[occ]), name


# The probe's forms (``hashrec.table.ops.find.triton``): (WORD_PROBE, WORD_PROBE_LOWEST,
# MASK_PROBE). By default a probe of buckets up to 128 slots takes masks.
PROBE_FORMS = {"by-position": (False, 2, 0), "by-word": (True, 2, 0),
               "three-by-word": (True, 3, 0), "masks": (True, 2, 1),
               "three-masks": (True, 3, 1)}


def capture_launch(monkeypatch, module, name: str) -> dict:
    """Stands a recorder in for kernel ``name`` of ``module``: each launch's keyword
    arguments (constexprs, warps) go into the returned dict, and nothing runs."""
    seen = {}

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs)

    monkeypatch.setattr(module, name, Kernel())
    return seen


def use_probe_form(monkeypatch, form: str) -> None:
    """Every probe in ``form`` (a ``PROBE_FORMS`` name): every digest match placed by
    position; the two or three lowest found by word from a (keys, line) tile; or from
    bit masks (buckets up to 128 slots, and wider multiples of 128 by 128-slot segments;
    other wide buckets then probe by word)."""
    from hashrec.table.ops.find import triton as find_tt
    word, lowest, masks = PROBE_FORMS[form]
    monkeypatch.setattr(find_tt, "WORD_PROBE", word)
    monkeypatch.setattr(find_tt, "WORD_PROBE_LOWEST", lowest)
    monkeypatch.setattr(find_tt, "MASK_PROBE", masks)

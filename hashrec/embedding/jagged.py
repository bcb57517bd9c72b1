"""Jagged sparse inputs in TorchRec's layout.

A ``KeyedJaggedTensor`` holds, for ``F`` keys (features) and a batch of ``B``
rows, one flat ``values`` tensor ordered key-major: all values of key 0 for
rows 0..B-1, then key 1, and so on. ``lengths`` has ``F * B`` entries (bag
sizes) and ``offsets`` is its exclusive cumulative sum with ``F * B + 1``
entries. ``weights``, when present, is parallel to ``values``.

Example::

    # keys ["a", "b"], batch of 2:  a = [[1, 2], []],  b = [[3], [4, 5]]
    kjt = KeyedJaggedTensor.from_lengths(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3, 4, 5]),
        lengths=torch.tensor([2, 0, 1, 2]),
    )
    kjt["b"].values   # tensor([3, 4, 5])
    kjt["b"].lengths  # tensor([1, 2])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class JaggedError(ValueError):
    """Inconsistent jagged layout (lengths, offsets, values or weights)."""


@dataclass(frozen=True)
class JaggedTensor:
    """The bags of one key: ``values`` (n,), ``lengths`` (B,), ``offsets`` (B + 1,).

    ``max_bag``: the longest bag when known on the host without reading a device
    tensor (set by ``KeyedJaggedTensor`` when its layout was summarized on the
    CPU), else None.
    """

    values: torch.Tensor
    lengths: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None = None
    max_bag: int | None = None

    def to_padded(self, max_length: int, pad_value: int = 0) -> torch.Tensor:
        """Dense (B, max_length) view with bags truncated to ``max_length``."""
        batch = self.lengths.numel()
        out = torch.full((batch, max_length), pad_value, dtype=self.values.dtype,
                         device=self.values.device)
        pos = torch.arange(self.values.numel(), device=self.values.device)
        row = torch.repeat_interleave(torch.arange(batch, device=pos.device), self.lengths)
        col = pos - self.offsets[:-1].repeat_interleave(self.lengths)
        keep = col < max_length
        out[row[keep], col[keep]] = self.values[keep]
        return out


def _offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


class KeyedJaggedTensor:
    """Variable-length sparse features for a batch, one jagged bag per (key, row).

    Args:
        keys: feature names, in order.
        values: (n,) ids (int64) of every bag, key-major.
        lengths: (len(keys) * B,) int bag sizes.
        weights: optional (n,) float weights parallel to ``values``.
        offsets: optional precomputed (len(keys) * B + 1,) offsets; computed from
            ``lengths`` when first asked for otherwise.
        validate: check the layout (1-D tensors, unique keys, lengths a multiple of
            the keys, non-negative, summing to the number of values, weights
            parallel to values). Producers that build the layout themselves
            (the feature parser, device moves) pass False to skip the checks and
            their host syncs.

    Raises:
        JaggedError: ``validate`` is True and the layout is inconsistent.
    """

    def __init__(
        self,
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        validate: bool = True,
    ) -> None:
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths.to(torch.int64)
        self._weights = weights
        self._offsets = offsets
        self._index = {k: i for i, k in enumerate(self._keys)}
        # Host copy of per-key value boundaries and longest bags (see _host_layout).
        self._layout: tuple[list[int], list[int]] | None = None
        self._key_offsets: torch.Tensor | None = None  # (F, B + 1), see _offsets_per_key
        if validate:
            self._validate()

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_lengths(cls, keys, values, lengths, weights=None) -> KeyedJaggedTensor:
        """Build from bag sizes ``lengths`` (len(keys) * B,)."""
        return cls(keys, values, lengths, weights)

    @classmethod
    def from_offsets(cls, keys, values, offsets, weights=None) -> KeyedJaggedTensor:
        """Build from offsets (len(keys) * B + 1,), starting at 0 and ending at len(values)."""
        offsets = offsets.to(torch.int64)
        if offsets.dim() != 1 or offsets.numel() == 0:
            raise JaggedError("offsets must be a non-empty 1-D tensor")
        return cls(keys, values, offsets[1:] - offsets[:-1], weights, offsets)

    @classmethod
    def concat(cls, parts: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
        """Join KJTs over disjoint keys with the same batch size."""
        if not parts:
            raise JaggedError("concat needs at least one KeyedJaggedTensor")
        strides = {p.stride() for p in parts if p.keys()}
        if len(strides) > 1:
            raise JaggedError(f"concat of different batch sizes {sorted(strides)}")
        keys = [k for p in parts for k in p.keys()]
        weighted = any(p.weights_or_none() is not None for p in parts)
        weights = None
        if weighted:
            weights = torch.cat([p.weights_or_none() if p.weights_or_none() is not None
                                 else torch.ones_like(p.values(), dtype=torch.float32)
                                 for p in parts])
        return cls(keys, torch.cat([p.values() for p in parts]),
                   torch.cat([p.lengths() for p in parts]), weights)

    def _validate(self) -> None:
        if self._values.dim() != 1:
            raise JaggedError(f"values must be 1-D, got shape {tuple(self._values.shape)}")
        if self._lengths.dim() != 1:
            raise JaggedError(f"lengths must be 1-D, got shape {tuple(self._lengths.shape)}")
        if len(set(self._keys)) != len(self._keys):
            raise JaggedError(f"duplicate keys in {self._keys}")
        n_keys = len(self._keys)
        if n_keys == 0:
            if self._lengths.numel() or self._values.numel():
                raise JaggedError("no keys but non-empty lengths or values")
            return
        if self._lengths.numel() % n_keys:
            raise JaggedError(
                f"lengths has {self._lengths.numel()} entries, not a multiple of "
                f"{n_keys} keys")
        if self._offsets is not None and self._offsets.numel() != self._lengths.numel() + 1:
            raise JaggedError("offsets must have len(lengths) + 1 entries")
        if self._lengths.numel() and bool((self._lengths < 0).any()):
            raise JaggedError("lengths must be non-negative")
        total = int(self.offsets()[-1])
        if total != self._values.numel():
            raise JaggedError(
                f"lengths sum to {total} but there are {self._values.numel()} values")
        if self._weights is not None and self._weights.shape != self._values.shape:
            raise JaggedError(
                f"weights shape {tuple(self._weights.shape)} != values shape "
                f"{tuple(self._values.shape)}")

    # -- accessors ------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _offsets_from_lengths(self._lengths)
        return self._offsets

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise JaggedError("this KeyedJaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def stride(self) -> int:
        """Batch size B."""
        return self._lengths.numel() // len(self._keys) if self._keys else 0

    @property
    def device(self) -> torch.device:
        return self._values.device

    def length_per_key(self) -> list[int]:
        bounds = self._host_layout()[0]
        return [end - start for start, end in zip(bounds, bounds[1:])]

    def _host_layout(self) -> tuple[list[int], list[int]]:
        """(boundaries of each key's values (F + 1,), longest bag per key (F,)) as ints.

        Computed once (one device read when on a GPU) and carried by ``to`` and
        ``pin_memory`` from the CPU, so slicing a device KJT by key reads nothing back.
        """
        if self._layout is None:
            n, b = len(self._keys), self.stride()
            if n == 0 or b == 0:
                self._layout = ([0] * (n + 1), [0] * n)
            else:
                bounds = self.offsets()[::b]
                longest = self._lengths.view(n, b).amax(1)
                host = torch.cat([bounds, longest]).tolist()
                self._layout = (host[:n + 1], host[n + 1:])
        return self._layout

    def host_layout(self) -> tuple[list[int], list[int]]:
        """(boundaries of each key's values (F + 1,), longest bag per key (F,)) as ints
        (one device read on a GPU unless carried from the CPU)."""
        return self._host_layout()

    def set_host_layout(self, layout: tuple[list[int], list[int]]) -> None:
        """Adopts a host layout computed elsewhere for the same tensors (a loader worker):
        ``(bounds (F + 1,), longest (F,))``. Raises ValueError on the wrong sizes."""
        bounds, longest = layout
        n = len(self._keys)
        if len(bounds) != n + 1 or len(longest) != n:
            raise ValueError(f"host layout for {n} keys needs {n + 1} bounds and {n} longest "
                             f"bags, got {len(bounds)} and {len(longest)}")
        self._layout = (list(bounds), list(longest))

    def _with_layout(self, other: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``other`` (same layout elsewhere) with this KJT's host layout, computed on CPU."""
        if self._layout is None and self._values.device.type == "cpu":
            self._host_layout()
        other._layout = self._layout
        return other

    def _offsets_per_key(self) -> torch.Tensor:
        """(F, B + 1) offsets of each key's bags within that key's values, for every key
        at once (a few kernels instead of two per key). One running sum over all the
        lengths, each key's part less the sum before it: on CUDA, torch's sum along the
        rows of an (F, B) matrix took 215 us for 10 keys of 104,857 bags on an H200
        (``benchmarks/results/embedding_layer_gpu_fresh_trace.txt``), where a sum over
        one dimension takes a few."""
        if self._key_offsets is None:
            n, b = len(self._keys), self.stride()
            offsets = torch.zeros(n, b + 1, dtype=torch.int64, device=self._lengths.device)
            if n and b:
                ends = torch.cumsum(self._lengths.reshape(n * b), 0, dtype=torch.int64)
                ends = ends.view(n, b)
                offsets[:, 1:] = ends
                offsets[1:, 1:] -= ends[:-1, -1:]
            self._key_offsets = offsets
        return self._key_offsets

    def __getitem__(self, key: str) -> JaggedTensor:
        if key not in self._index:
            raise KeyError(f"feature {key!r} not in KeyedJaggedTensor keys {self._keys}")
        i, b = self._index[key], self.stride()
        bounds, longest = self._host_layout()
        start, end = bounds[i], bounds[i + 1]
        lengths = self._lengths[i * b:(i + 1) * b]
        w = self._weights[start:end] if self._weights is not None else None
        return JaggedTensor(self._values[start:end], lengths, self._offsets_per_key()[i], w,
                            longest[i])

    def to_dict(self) -> dict[str, JaggedTensor]:
        """Every key's bags: what ``self[key]`` gives, made in a few calls for all keys."""
        n, b = len(self._keys), self.stride()
        if n == 0:
            return {}
        bounds, longest = self._host_layout()
        sizes = [bounds[i + 1] - bounds[i] for i in range(n)]
        values = self._values[bounds[0]:bounds[-1]].split(sizes)
        weights = self._weights[bounds[0]:bounds[-1]].split(sizes) \
            if self._weights is not None else [None] * n
        lengths = self._lengths.view(n, b).unbind(0)
        offsets = self._offsets_per_key().unbind(0)
        return {k: JaggedTensor(values[i], lengths[i], offsets[i], weights[i], longest[i])
                for i, k in enumerate(self._keys)}

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedJaggedTensor:
        """This KJT on ``device``: itself when every tensor is already there."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        own = (self._values, self._lengths, self._weights, self._offsets)
        moved = [move(t) for t in own]
        if all(m is t for m, t in zip(moved, own)):
            return self._with_layout(self)
        return self._with_layout(KeyedJaggedTensor(self._keys, *moved, validate=False))

    def pin_memory(self) -> KeyedJaggedTensor:
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return self._with_layout(KeyedJaggedTensor(
            self._keys, pin(self._values), pin(self._lengths), pin(self._weights),
            pin(self._offsets), validate=False))

    def __repr__(self) -> str:
        return (f"KeyedJaggedTensor(keys={self._keys}, batch={self.stride()}, "
                f"values={self._values.numel()}, weighted={self._weights is not None})")

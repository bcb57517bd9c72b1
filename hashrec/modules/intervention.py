"""DC2VR's intervention: a task's representation corrected, in a low-rank space it shares
with other tasks' representations, by what those say (TorchEasyRec's ``Intervention``).

With ``W_b`` (D_b, r) and ``W_s`` (D_s, r), each of orthonormal columns (orthonormal rows
where D_s < r), a base ``x_b`` (B, D_b) and a source ``x_s`` (B, D_s)::

    out = x_b + (x_b W_b - sg(x_s) W_s) W_b^T        (B, D_b)

``sg`` stops the gradient: the source's towers are not trained through the intervention.
The part of ``x_b`` outside ``W_b``'s columns is kept; the part inside becomes
``2 x_b W_b - x_s W_s`` (TorchEasyRec's sign: an interchange intervention would set it to
``x_s W_s``).
TorchEasyRec keeps ``W_b`` and ``W_s`` orthonormal with torch's orthogonal
parametrization (its default for a real non-square matrix: Householder reflections with
trivialization); :class:`OrthonormalMatrix` is that map written in plain tensor operations,
so that the scripted export and the CUDA graphs take it and nothing is read on the host.
"""

from __future__ import annotations

import torch
from torch import nn


class OrthonormalMatrix(nn.Module):
    """A trained (rows, cols) matrix of orthonormal columns (rows where rows < cols).

    ``forward() -> weight (rows, cols)``. Over the tall shape (n, k), n = max(rows, cols),
    k = min: ``weight = base @ Q``, where ``base`` (n, n) is a fixed orthogonal matrix
    drawn at construction (``nn.init.orthogonal_``, so the start is ``base[:, :k]``) and
    ``Q = -H_1 H_2 ... H_k [:, :k]`` is the product of the Householder reflections
    ``H_i = I - tau_i v_i v_i^T``, ``v_i = e_i + raw[:, i]`` below the diagonal (the
    trained part of ``raw``), ``tau_i = 2 / |v_i|^2``. With ``raw`` zero, Q is the
    identity's first k columns. This is torch's ``parametrizations.orthogonal`` for a
    non-square real matrix (its raw matrix starts at -I, whose diagonal, never trained,
    is the sign here); for a square one torch uses the matrix exponential, which spans
    the same matrices by another path.

    Args:
        rows: the matrix's rows (1 or more).
        cols: its columns (1 or more).
    """

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        if rows < 1 or cols < 1:
            raise ValueError(f"OrthonormalMatrix shape ({rows}, {cols}); allowed: both 1 "
                             f"or more")
        self.transposed = rows < cols
        n, k = max(rows, cols), min(rows, cols)
        self.raw = nn.Parameter(torch.zeros(n, k))
        self.register_buffer("base", nn.init.orthogonal_(torch.empty(n, n)))
        self.register_buffer("eye", torch.eye(n, k), persistent=False)

    def forward(self) -> torch.Tensor:
        reflectors = torch.tril(self.raw, -1) + self.eye  # v_i, column i
        tau = 2.0 / (reflectors * reflectors).sum(dim=0)  # (k,)
        q = self.eye
        k = reflectors.shape[1]
        for i in range(k - 1, -1, -1):  # H_1 (H_2 (... (H_k E)))
            v = reflectors[:, i:i + 1]
            q = q - tau[i] * v * (v * q).sum(dim=0, keepdim=True)
        weight = -(self.base @ q)
        return weight.t() if self.transposed else weight


class Intervention(nn.Module):
    """``forward(base (B, D_b), source (B, D_s)) -> (B, D_b)``, see the module docstring.

    Args:
        base_dim: D_b, the intervened representation's width (above ``low_rank_dim``).
        source_dim: D_s, the source's width (1 or more).
        low_rank_dim: r, the shared space's width (1 or more).
    """

    def __init__(self, base_dim: int, source_dim: int, low_rank_dim: int) -> None:
        super().__init__()
        if not 1 <= low_rank_dim < base_dim:
            raise ValueError(f"Intervention low_rank_dim={low_rank_dim} over a base of "
                             f"width {base_dim}; allowed: 1 to {base_dim - 1}")
        if source_dim < 1:
            raise ValueError(f"Intervention source_dim={source_dim}; allowed: 1 or more")
        self.base_dim = base_dim
        self.base_rotation = OrthonormalMatrix(base_dim, low_rank_dim)
        self.source_rotation = OrthonormalMatrix(source_dim, low_rank_dim)

    def output_dim(self) -> int:
        return self.base_dim

    def forward(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        w_base = self.base_rotation()
        shift = base @ w_base - source.detach() @ self.source_rotation()
        return shift @ w_base.t() + base

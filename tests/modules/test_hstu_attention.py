"""hstu_attention: the Triton kernels against the PyTorch reference, forward and backward
(the interpreter on CPU; CUDA where present)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed")

from hashrec.modules.hstu_attention import reference  # noqa: E402
from hashrec.modules.hstu_attention import triton as kernel  # noqa: E402
from hashrec.modules.stu import stu_mask  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(batch, length, heads, a, dv, seed, strided=True):
    """q, k, v as views of one projection (B, L, H * (2A + Dv)), as the layers split them."""
    g = torch.Generator().manual_seed(seed)
    width = heads * (2 * a + dv)
    projected = torch.randn(batch, length, width, generator=g).to(DEVICE)
    if not strided:
        projected = projected[..., :width]
    q, k, v = torch.split(projected, [heads * a, heads * a, heads * dv], dim=-1)
    return (q.reshape(batch, length, heads, a), k.reshape(batch, length, heads, a),
            v.reshape(batch, length, heads, dv))


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def _compare(q, k, v, allowed, alpha, divisor, seed=0, atol=1e-4):
    g = torch.Generator().manual_seed(seed + 100)
    grad = torch.randn(v.shape, generator=g).to(DEVICE)
    ref = _leaves(q, k, v)
    got = _leaves(q, k, v)
    want = reference.hstu_attention(*ref, allowed, alpha, divisor)
    out = kernel.hstu_attention(*got, allowed, alpha, divisor)
    torch.testing.assert_close(out, want, atol=atol, rtol=1e-4)
    (want * grad).sum().backward()
    (out * grad).sum().backward()
    for name, r, t in zip("qkv", ref, got):
        torch.testing.assert_close(t.grad, r.grad, atol=atol, rtol=1e-4, msg=f"d{name}")


@pytest.mark.parametrize("case", [
    # (batch, length, heads, A, Dv, contextual, targets, window)
    (2, 13, 2, 8, 8, 0, False, 0),       # sizes below a tile, padded dims
    (3, 21, 2, 16, 32, 2, True, 0),      # contextual tokens and targets
    (2, 19, 1, 8, 4, 1, False, 5),       # a window
    (1, 70, 2, 8, 8, 0, True, 0),        # two tiles of 64 positions
    (2, 32, 2, 8, 8, 1, True, 0),        # the mask's rows unpadded (32 bytes)
], ids=["small", "contextual-targets", "window", "two-tiles", "unpadded-mask"])
def test_kernels_match_reference(case):
    batch, length, heads, a, dv, contextual, targets, window = case
    g = torch.Generator().manual_seed(length)
    lengths = torch.randint(contextual + 2, length + 1, (batch,), generator=g)
    lengths[0] = length  # one full row
    num_targets = torch.minimum(torch.full((batch,), 3), lengths - contextual - 1) \
        if targets else None
    allowed = stu_mask(lengths, length, contextual, window, num_targets).to(DEVICE)
    q, k, v = _inputs(batch, length, heads, a, dv, seed=length)
    _compare(q, k, v, allowed, alpha=0.35, divisor=float(length))


@pytest.mark.parametrize("launch", [
    {"forward": (16, 32, 4), "keys_values": (32, 16, 4), "queries": (16, 64, 8)},
    {"forward": (64, 16, 8), "keys_values": (16, 64, 4), "queries": (32, 16, 4)},
], ids=["narrow-queries", "narrow-keys"])
def test_kernels_match_reference_with_unequal_tiles(launch, monkeypatch):
    """Query and key tiles of different sides in each kernel (rows of 2 to 5 tiles)."""
    monkeypatch.setattr(kernel, "LAUNCH", launch)
    lengths = torch.tensor([70, 37, 9])
    allowed = stu_mask(lengths, 70, 2, 0, torch.tensor([4, 3, 1])).to(DEVICE)
    q, k, v = _inputs(3, 70, 2, 16, 8, seed=12)
    _compare(q, k, v, allowed, alpha=0.3, divisor=70.0)


# Triton 3.6's interpreter multiplies bfloat16 tiles wrongly in tl.dot (a plain
# bfloat16 load and store are exact there), so bfloat16 is checked on CUDA only.
HALVES = [torch.float16] + ([torch.bfloat16] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("dtype", HALVES)
def test_half_inputs_within_half_precision_of_float32(dtype):
    """Half inputs (an autocast step's) take the tile products in that dtype, scores and
    weights in float32: within half precision's error of the float32 reference."""
    batch, length, heads = 2, 21, 2
    lengths = torch.tensor([21, 12])
    allowed = stu_mask(lengths, length, 2, 0, torch.tensor([3, 2])).to(DEVICE)
    q, k, v = _inputs(batch, length, heads, 16, 16, seed=8)
    grad = torch.randn(v.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    ref = _leaves(q, k, v)
    want = reference.hstu_attention(*ref, allowed, 0.25, float(length))
    (want * grad).sum().backward()
    got = _leaves(*(t.to(dtype) for t in (q, k, v)))
    out = kernel.hstu_attention(*got, allowed, 0.25, float(length))
    (out.float() * grad).sum().backward()
    assert out.dtype == dtype and all(t.grad.dtype == dtype for t in got)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert (out.float() - want).abs().max() <= tol * want.abs().max()
    for r, t in zip(ref, got):
        assert (t.grad.float() - r.grad).abs().max() <= tol * r.grad.abs().max()


def test_float32_inputs_take_autocasts_dtype_as_the_reference():
    """Under autocast, float32 q, k, v (the STU layer's projection past its bias) run the
    tiles in autocast's dtype, as the reference's products do, not in IEEE float32; the
    gradients come back to the float32 leaves."""
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float16
    length = 21
    allowed = stu_mask(torch.tensor([21, 9]), length, 2, 0, torch.tensor([3, 2])).to(DEVICE)
    q, k, v = _inputs(2, length, 2, 16, 16, seed=10)
    grad = torch.randn(v.shape, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    results = []
    for fn in (reference.hstu_attention, kernel.hstu_attention):
        leaves = _leaves(q, k, v)
        with torch.autocast(DEVICE.type, dtype=dtype):
            out = fn(*leaves, allowed, 0.25, float(length))
        (out.float() * grad).sum().backward()
        assert out.dtype == dtype and all(t.grad.dtype == torch.float32 for t in leaves)
        results.append([out.float()] + [t.grad for t in leaves])
    for want, got in zip(*results):
        assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_one_mask_for_every_row_and_contiguous_inputs():
    length = 17
    steps = torch.arange(length)
    allowed = (steps.unsqueeze(1) >= steps.unsqueeze(0)).to(DEVICE)  # (L, L), HSTU encoder's
    q, k, v = _inputs(3, length, 2, 16, 16, seed=5, strided=False)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    _compare(q, k, v, allowed, alpha=1.0, divisor=7.0)


def test_masked_positions_read_nothing():
    """Noise at positions no one reads changes no output of the rest."""
    batch, length, heads = 2, 12, 2
    lengths = torch.tensor([12, 7])
    allowed = stu_mask(lengths, length).to(DEVICE)
    q, k, v = _inputs(batch, length, heads, 8, 8, seed=3)
    noisy = [t.clone() for t in (q, k, v)]
    for t in noisy:
        t[1, 7:] = 5 * torch.randn(t[1, 7:].shape, device=DEVICE)
    clean = kernel.hstu_attention(q, k, v, allowed, 0.5, 12.0)
    dirty = kernel.hstu_attention(*noisy, allowed, 0.5, 12.0)
    torch.testing.assert_close(dirty[1, :7], clean[1, :7])
    torch.testing.assert_close(dirty[0], clean[0])


def test_errors_name_the_shapes():
    q, k, v = _inputs(2, 5, 1, 8, 8, seed=0)
    with pytest.raises(ValueError, match="bool"):
        kernel.hstu_attention(q, k, v, torch.ones(2, 5, 5, device=DEVICE), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\(L, L\) or \(B, L, L\)"):
        kernel.hstu_attention(q, k, v, torch.ones(2, 4, 4, dtype=torch.bool, device=DEVICE),
                              1.0, 1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        kernel.hstu_attention(q, k, v.double(), torch.ones(5, 5, dtype=torch.bool,
                                                           device=DEVICE), 1.0, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_match_reference_in_float32(dtype):
    """Half-precision q, k, v (an autocast step's): within half precision's error of the
    float32 reference at dlrm_hstu's layer shapes."""
    batch, length, heads = 64, 78, 4
    lengths = torch.randint(20, length + 1, (batch,))
    allowed = stu_mask(lengths, length, 2, 0, torch.full((batch,), 8)).cuda()
    q, k, v = _inputs(batch, length, heads, 32, 32, seed=1)
    grad = torch.randn(v.shape, device=DEVICE)
    ref = _leaves(q, k, v)
    want = reference.hstu_attention(*ref, allowed, 1 / 32 ** 0.5, float(length))
    (want * grad).sum().backward()
    got = _leaves(*(t.to(dtype) for t in (q, k, v)))
    out = kernel.hstu_attention(*got, allowed, 1 / 32 ** 0.5, float(length))
    (out.float() * grad).sum().backward()
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    scale = want.abs().max()
    assert (out.float() - want).abs().max() <= tol * scale
    for r, t in zip(ref, got):
        assert (t.grad.float() - r.grad).abs().max() <= tol * r.grad.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_more_rows_and_heads_than_a_grid_axis_of_65535():
    batch, length, heads = 20_000, 9, 4
    lengths = torch.randint(1, length + 1, (batch,))
    allowed = stu_mask(lengths, length).cuda()
    q, k, v = _inputs(batch, length, heads, 16, 16, seed=2)
    _compare(q, k, v, allowed, alpha=0.25, divisor=9.0)


@pytest.fixture
def kernels_setting(monkeypatch):
    """Sets HASHREC_HSTU_KERNELS and returns ``kernels_on`` read afresh; the cached value
    is dropped after the test (monkeypatch then restores the variable)."""
    from hashrec.modules import hstu_attention

    def setting(raw: str):
        monkeypatch.setenv("HASHREC_HSTU_KERNELS", raw)
        hstu_attention.kernels_on.cache_clear()
        return hstu_attention.kernels_on

    yield setting
    hstu_attention.kernels_on.cache_clear()


def test_setting_chooses_the_cuda_path_and_refuses_other_values(kernels_setting):
    for raw, on in (("1", True), ("0", False)):
        assert kernels_setting(raw)() is on
    with pytest.raises(ValueError, match="HASHREC_HSTU_KERNELS must be 0 or 1"):
        kernels_setting("2")()


def test_kernels_path_reads_nothing_on_the_host():
    from host_reads import HostReads
    lengths = torch.tensor([9, 4, 6])
    allowed = stu_mask(lengths, 9, 1, 0, torch.tensor([2, 1, 1])).to(DEVICE)
    q, k, v = _leaves(*_inputs(3, 9, 2, 8, 8, seed=4))
    with HostReads(tolist=True) as reads:
        out = kernel.hstu_attention(q, k, v, allowed, 0.5, 9.0)
        out.sum().backward()
    assert not reads.counts, dict(reads.counts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stu_layer_with_kernels_matches_without_under_autocast(kernels_setting):
    """dlrm_hstu's STU layer, forward and backward under BF16 autocast, kernels on and off."""
    from hashrec.modules.stu import STULayer
    batch, length = 256, 78
    torch.manual_seed(0)
    layer = STULayer(128, 4, 32, 32, 0.0, use_group_norm=True, scaling_seqlen=72).cuda()
    lengths = torch.randint(20, length + 1, (batch,))
    allowed = stu_mask(lengths, length, 6, 0, torch.full((batch,), 8)).cuda()
    x = torch.randn(batch, length, 128, device=DEVICE)
    results = {}
    for on in (False, True):
        kernels_setting("1" if on else "0")
        leaf = x.clone().requires_grad_(True)
        layer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(leaf, allowed)
        out.float().square().mean().backward()
        results[on] = [out.float(), leaf.grad, layer.uvqk_weight.grad.float()]
    for off, on in zip(results[False], results[True]):
        assert (on - off).abs().max() <= 2e-2 * off.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernels_replay_from_a_cuda_graph_as_eager():
    batch, length, heads = 64, 40, 4
    lengths = torch.randint(5, length + 1, (batch,))
    allowed = stu_mask(lengths, length, 2).cuda()
    q, k, v = _leaves(*_inputs(batch, length, heads, 32, 32, seed=6))
    grad = torch.randn(v.shape, device=DEVICE)

    def step():
        for t in (q, k, v):
            t.grad = None
        out = kernel.hstu_attention(q, k, v, allowed, 0.2, 40.0)
        out.backward(grad)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step().detach().clone()
        eager_grads = [t.grad.clone() for t in (q, k, v)]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in (q, k, v):
            t.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager)
    for t, want in zip((q, k, v), eager_grads):
        torch.testing.assert_close(t.grad, want)


def test_importing_the_hstu_models_leaves_triton_unimported():
    """Triton reads TRITON_INTERPRET when first imported: a model module importing it would
    fix the kernels' mode for every test module collected after it."""
    import subprocess
    import sys
    code = ("import sys; import hashrec.models.dlrm_hstu, hashrec.models.hstu_match, "
            "hashrec.modules.hstu; print('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_float64_takes_the_reference():
    lengths = torch.tensor([6, 3])
    allowed = stu_mask(lengths, 6).to(DEVICE)
    q, k, v = (t.double() for t in _inputs(2, 6, 1, 8, 8, seed=7))
    torch.testing.assert_close(kernel.hstu_attention(q, k, v, allowed, 0.5, 6.0),
                               reference.hstu_attention(q, k, v, allowed, 0.5, 6.0),
                               rtol=0, atol=0)

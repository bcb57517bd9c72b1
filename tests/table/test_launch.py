"""fast_launch: the first launch of a specialization goes through Triton, later ones
call the compiled launcher with every parameter in signature order; anything Triton
specializes on differently goes through Triton again."""

import pytest
import torch
from triton import knobs

from hashrec.table.ops import launch


class _Param:
    def __init__(self, name, constexpr):
        self.name, self.is_constexpr = name, constexpr


class _Compiled:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "meta"

    def run(self, *args):
        self.log.append(("fast", args))


class _FakeJit:
    """Stands for a JITFunction of ``def k(x, y, n, MODE: constexpr, BLOCK=64)``."""

    def __init__(self):
        def k(x, y, n, MODE, BLOCK=64):
            pass

        self.fn, self.device_caches, self.log = k, {}, []
        self.params = [_Param(n, n in ("MODE", "BLOCK")) for n in ("x", "y", "n", "MODE", "BLOCK")]
        self.arg_names = [p.name for p in self.params]

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return _Compiled(self.log)
        return run


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda device: 99)
    return launch.fast_launch(_FakeJit())


def _kinds(k):
    return [entry[0] for entry in k.kernel.log]


def test_second_launch_calls_the_launcher_with_all_parameters_in_order(kernel):
    x, y = torch.zeros(8), torch.zeros(8, dtype=torch.int64)
    kernel[(3,)](x, y, 100, MODE=2, num_warps=4)
    kernel[(5, 2)](x, y, 116, MODE=2, num_warps=4)
    assert _kinds(kernel) == ["triton", "fast"]
    assert kernel.kernel.log[1][1] == (5, 2, 1, 99, "fn", "meta", None, None, None,
                                       x, y, 116, 2, 64)


@pytest.mark.parametrize("change", ["alignment", "dtype", "int_is_one", "int_div16",
                                    "int_64bit", "constexpr_kwarg", "constexpr_position",
                                    "option"])
def test_what_triton_specializes_on_goes_through_triton_again(kernel, change):
    base = torch.zeros(64, dtype=torch.uint8)
    x, y, n, mode, kwargs = base[:16], base[16:32], 100, 2, {"num_warps": 4}
    kernel[(1,)](x, y, n, mode, **kwargs)
    if change == "alignment":
        x = base[1:17]
    elif change == "dtype":
        y = y.view(torch.int8)
    elif change == "int_is_one":
        n = 1
    elif change == "int_div16":
        n = 96
    elif change == "int_64bit":
        n = 1 << 40
    elif change == "constexpr_position":
        mode = 3
    elif change == "constexpr_kwarg":
        kwargs["BLOCK"] = 128
    else:
        kwargs["num_warps"] = 8
    kernel[(1,)](x, y, n, mode, **kwargs)
    assert _kinds(kernel) == ["triton", "triton"]
    kernel[(1,)](x, y, n, mode, **kwargs)
    assert _kinds(kernel) == ["triton", "triton", "fast"]


def test_empty_grids_launch_nothing(kernel):
    x = torch.zeros(4)
    kernel[(2,)](x, x, 7, 1)
    kernel[(0,)](x, x, 7, 1)
    assert _kinds(kernel) == ["triton"]


def test_launch_hooks_and_callable_grids_go_through_triton(kernel, monkeypatch):
    x = torch.zeros(4)
    kernel[(2,)](x, x, 7, 1)
    kernel[lambda meta: (2,)](x, x, 7, 1)
    chain = knobs.HookChain()
    chain.add(lambda *a: None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", chain)
    kernel[(2,)](x, x, 7, 1)
    assert _kinds(kernel) == ["triton"] * 3


def test_interpreted_kernels_always_go_through_triton(monkeypatch):
    fake = _FakeJit()
    del fake.device_caches  # what the interpreter's functions lack
    k = launch.fast_launch(fake)
    x = torch.zeros(4)
    for _ in range(2):
        k[(1,)](x, x, 7, 1)
    assert _kinds(k) == ["triton", "triton"]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 33])
def test_aligned_rows_start_every_row_16_byte_aligned(dtype, n):
    rows = launch.aligned_rows(3, n, dtype, torch.device("cpu"))
    assert rows.shape == (3, n) and rows.dtype == dtype
    if n:
        assert rows.stride(0) * dtype.itemsize % 16 == 0 and rows.stride(0) >= n
    assert all(row.data_ptr() % 16 == 0 and row.is_contiguous() for row in rows.unbind(0))

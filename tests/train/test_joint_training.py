"""Storages of one row width deduplicated and emitted together (``joint``) train
exactly as storage by storage."""

from __future__ import annotations

import pytest
import torch
from small_din import STEPS, generate_data, small_loop, trained_state

from hashrec.embedding import batching, joint


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate_data(out, seed=5)
    return out


def _trained(data_dir, model_dir, monkeypatch, enabled: str, sorts: list,
             device: str = "cpu") -> dict:
    """The example dynamicemb config (a dynamic storage and a dense group, both 16 wide)
    after STEPS steps; ``sorts`` collects the logical tables of each dedup sort."""
    monkeypatch.setenv(joint.ENV, enabled)
    loop = small_loop(model_dir, device)
    real = batching._sort_storage
    monkeypatch.setattr(batching, "_sort_storage",
                        lambda *args: sorts.append(len(args[0])) or real(*args))
    loop.run(str(data_dir))
    monkeypatch.setattr(batching, "_sort_storage", real)
    assert loop.step == STEPS
    return trained_state(loop)


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_a_join_trains_exactly_as_its_storages_apart(data_dir, tmp_path, monkeypatch, device):
    apart_sorts, joint_sorts = [], []
    apart = _trained(data_dir, tmp_path / "apart", monkeypatch, "0", apart_sorts, device)
    joined = _trained(data_dir, tmp_path / "joint", monkeypatch, "1", joint_sorts, device)
    # Apart: per batch one sort of the dynamic storage's 6 tables and one of the dense
    # group's; joined: one sort of all of them.
    assert len(apart_sorts) == 2 * len(joint_sorts) and len(set(joint_sorts)) == 1
    assert joint_sorts[0] == sum(set(apart_sorts))
    assert apart.keys() == joined.keys()
    assert any(name.startswith("table ") for name in apart)
    for name, value in apart.items():
        assert torch.equal(value, joined[name]), name

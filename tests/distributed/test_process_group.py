import pytest
import torch

from hashrec.distributed.errors import DistributedError
from hashrec.distributed.process_group import (
    DistContext,
    init_distributed,
    single_process_context,
    teardown,
)


def test_no_torchrun_environment_gives_a_single_process_context():
    ctx = init_distributed(use_cuda=False, env={})
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.backend) == (0, 1, True, None)
    assert ctx.device == torch.device("cpu") and not ctx.is_distributed
    teardown(ctx)  # nothing to destroy


def test_partial_environment_names_the_missing_variables():
    with pytest.raises(DistributedError, match="MASTER_ADDR, MASTER_PORT missing"):
        init_distributed(use_cuda=False, env={"RANK": "0", "WORLD_SIZE": "2"})


def test_malformed_environment_names_the_variable():
    env = {"RANK": "zero", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(DistributedError, match="RANK='zero'"):
        init_distributed(use_cuda=False, env=env)


def test_nccl_without_cuda_is_refused():
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(DistributedError, match="nccl"):
        init_distributed(backend="nccl", use_cuda=False, env=env)


@pytest.mark.parametrize("kwargs,field", [
    ({"world_size": 0}, "world_size"),
    ({"rank": 2, "world_size": 2, "is_main": False}, "rank"),
    ({"rank": 1, "world_size": 2, "is_main": True}, "is_main"),
    ({"backend": "mpi"}, "backend"),
], ids=["world0", "rank-out-of-range", "is-main-mismatch", "backend"])
def test_context_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DistContext(**kwargs)


def test_single_process_context_device():
    assert single_process_context("cpu").device == torch.device("cpu")


@pytest.mark.parametrize("value, seconds", [(None, 1800.0), ("", 1800.0), ("90", 90.0),
                                            ("2.5", 2.5)])
def test_the_collective_timeout_comes_from_the_environment(monkeypatch, value, seconds):
    import torch.distributed as dist

    given = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda **kwargs: given.update(timeout=kwargs["timeout"]))
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    if value is not None:
        env["HASHREC_COLLECTIVE_TIMEOUT_S"] = value
    init_distributed(use_cuda=False, env=env)
    assert given["timeout"].total_seconds() == seconds


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_bad_collective_timeout_is_refused_by_name(value):
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "HASHREC_COLLECTIVE_TIMEOUT_S": value}
    with pytest.raises(DistributedError, match=rf"HASHREC_COLLECTIVE_TIMEOUT_S='{value}': "
                                               rf"expected a number of seconds > 0"):
        init_distributed(use_cuda=False, env=env)

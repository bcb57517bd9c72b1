import math

import numpy as np
import pytest
import torch

from hashrec.table import (
    AdmissionOptions,
    CheckMode,
    InitializerArgs,
    InitializerMode,
    ScoreStrategy,
    SparseAdam,
    SparseRowWiseAdagrad,
    StorageMode,
    TableOptions,
)


def test_enums_accept_strings_any_case():
    opts = TableOptions(dim=8, max_capacity=100, score_strategy="lfu", check_mode="Error",
                        initializer=InitializerArgs(mode="truncated_normal"))
    assert opts.score_strategy is ScoreStrategy.LFU
    assert opts.check_mode is CheckMode.ERROR
    assert opts.initializer.mode is InitializerMode.TRUNCATED_NORMAL


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"bucket_capacity": 0}, "bucket_capacity", "0"),
        ({"init_capacity": 200}, "init_capacity", "200"),
        ({"score_strategy": "MRU"}, "score_strategy", "'MRU'"),
        ({"dim": 0}, "dim", "0"),
        ({"dim": 2.5}, "dim", "2.5"),
        ({"max_capacity": -1}, "max_capacity", "-1"),
        ({"cache_load_factor": 0.0}, "cache_load_factor", "0.0"),
        ({"check_mode": "LOUD"}, "check_mode", "'LOUD'"),
        ({"dtype": torch.int32}, "dtype", "torch.int32"),
        ({"max_load_factor": 1.5}, "max_load_factor", "1.5"),
        ({"optimizer": "adam"}, "optimizer", "'adam'"),
        ({"admission": 3}, "admission", "3"),
        ({"seed": 2**70}, "seed", str(2**70)),
        ({"seed": 2**63}, "seed", str(2**63)),
        ({"name": 3}, "name", "3"),
        ({"max_capacity": True}, "max_capacity", "True"),
        ({"max_capacity": np.bool_(True)}, "max_capacity", "np.True_"),
        ({"dim": np.float32(8.0)}, "dim", "np.float32(8.0)"),
        ({"cache_load_factor": np.float32("nan")}, "cache_load_factor", "np.float32(nan)"),
        ({"set_by_user": "caching"}, "set_by_user", "'caching'"),
        ({"set_by_user": {"dim"}}, "set_by_user", "{'dim'}"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(v),
)
def test_invalid_table_options_name_field_and_value(kwargs, field, value):
    base = {"dim": 8, "max_capacity": 100}
    base.update(kwargs)
    with pytest.raises(ValueError) as info:
        TableOptions(**base)
    assert f"{field}={value}" in str(info.value)
    assert "allowed" in str(info.value)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: InitializerArgs(mode="GAUSS"), "mode"),
        (lambda: InitializerArgs(std_dev=-1.0), "std_dev"),
        (lambda: InitializerArgs(lower=1.0, upper=0.0), "lower"),
        (lambda: InitializerArgs(mean=float("nan")), "mean"),
        (lambda: AdmissionOptions(threshold=-1), "threshold"),
        (lambda: AdmissionOptions(threshold=2, counter_bucket_capacity=0),
         "counter_bucket_capacity"),
        (lambda: SparseAdam(beta1=1.0), "beta1"),
        (lambda: SparseRowWiseAdagrad(lr=-0.1), "lr"),
        (lambda: SparseAdam(lr=float("nan")), "lr"),
        (lambda: InitializerArgs(key_seed=2**63), "key_seed"),
    ],
    ids=["mode", "std_dev", "lower-upper", "mean-nan", "threshold", "counter-bucket", "beta1",
         "lr", "lr-nan", "key-seed-past-int64"],
)
def test_invalid_sub_options(build, field):
    with pytest.raises(ValueError, match=f"{field}="):
        build()


def test_storage_mode_derivation():
    assert TableOptions(dim=4, max_capacity=8).storage_mode is StorageMode.HBM_ONLY
    assert TableOptions(dim=4, max_capacity=8,
                        cache_load_factor=0.5).storage_mode is StorageMode.HYBRID
    assert TableOptions(dim=4, max_capacity=8, cache_load_factor=0.5,
                        caching=True).storage_mode is StorageMode.CACHING


def test_initializer_defaults_follow_seed():
    args = InitializerArgs().resolved(dim=16, max_capacity=10000)
    assert args.mode is InitializerMode.UNIFORM
    assert args.std_dev == pytest.approx(math.sqrt(1 / 16))
    assert args.lower == pytest.approx(-0.01) and args.upper == pytest.approx(0.01)
    opts = TableOptions(dim=4, max_capacity=8)
    assert opts.eval_initializer.mode is InitializerMode.CONSTANT
    assert opts.eval_initializer.value == 0.0


def test_row_dim_includes_optimizer_state():
    assert TableOptions(dim=8, max_capacity=8).row_dim == 8
    assert TableOptions(dim=8, max_capacity=8, optimizer=SparseAdam()).row_dim == 24
    assert TableOptions(dim=8, max_capacity=8, optimizer=SparseRowWiseAdagrad()).row_dim == 9


def test_largest_seeds_are_accepted():
    TableOptions(dim=2, max_capacity=64, seed=2**63 - 1,
                 initializer=InitializerArgs(key_seed=2**63 - 1))


def test_numpy_scalars_are_accepted_and_stored_as_python_numbers():
    opts = TableOptions(dim=np.int32(8), max_capacity=np.int64(100),
                        init_capacity=np.uint16(10), bucket_capacity=np.int64(32),
                        cache_load_factor=np.float32(0.5), max_load_factor=np.float64(0.5),
                        seed=np.int64(7),
                        initializer=InitializerArgs(lower=np.float32(-0.25), upper=np.int8(1),
                                                    key_seed=np.uint64(3)),
                        admission=AdmissionOptions(threshold=np.int64(2),
                                                   counter_capacity=np.int32(64)))
    plain = [(opts.dim, int), (opts.max_capacity, int), (opts.init_capacity, int),
             (opts.bucket_capacity, int), (opts.seed, int), (opts.cache_load_factor, float),
             (opts.max_load_factor, float), (opts.initializer.lower, float),
             (opts.initializer.upper, float), (opts.initializer.key_seed, int),
             (opts.admission.threshold, int), (opts.admission.counter_capacity, int)]
    assert [type(value) for value, _ in plain] == [kind for _, kind in plain]
    assert (opts.max_capacity, opts.cache_load_factor, opts.initializer.lower) == (100, 0.5,
                                                                                  -0.25)
    assert opts.storage_mode is StorageMode.HYBRID
    assert opts == TableOptions(dim=8, max_capacity=100, init_capacity=10, bucket_capacity=32,
                                cache_load_factor=0.5, max_load_factor=0.5, seed=7,
                                initializer=InitializerArgs(lower=-0.25, upper=1, key_seed=3),
                                admission=AdmissionOptions(threshold=2, counter_capacity=64))


def test_set_by_user_is_a_frozenset_of_the_storage_choices():
    assert TableOptions(dim=4, max_capacity=8).set_by_user == frozenset()
    opts = TableOptions(dim=4, max_capacity=8, set_by_user=["caching", "cache_load_factor"])
    assert opts.set_by_user == frozenset({"caching", "cache_load_factor"})
    hash(opts)  # options stay hashable (table fusion groups by them)

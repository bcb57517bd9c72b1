import pytest
import torch

from hashrec.distributed.storage_estimate import per_rank_options
from hashrec.embedding.errors import EmbeddingError
from hashrec.embedding.plan import plan_storages
from hashrec.embedding.specs import EmbeddingTableSpec
from hashrec.table import (
    AdmissionOptions,
    InitializerArgs,
    SparseAdagrad,
    SparseAdam,
    SparseSGD,
    TableOptions,
)

NORMAL = InitializerArgs(mode="NORMAL", std_dev=0.05)


def _table(name, group="g", dim=8, capacity=128, **kwargs):
    options = TableOptions(dim=dim, max_capacity=capacity, initializer=NORMAL, **kwargs)
    return EmbeddingTableSpec(name, dim, dynamic=options, fusion_group=group)


def _layout(tables):
    plans = plan_storages(tables, SparseAdagrad(lr=0.1), torch.device("cpu"))
    return {p.name: [t.name for t in p.tables] for p in plans}


def test_same_group_dim_and_options_fuse_with_summed_capacity():
    adm = AdmissionOptions(threshold=2, counter_capacity=100)
    plans = plan_storages([_table("a", capacity=100, admission=adm),
                           _table("b", capacity=300, admission=adm),
                           EmbeddingTableSpec("dense", 8, num_rows=10)],
                          SparseSGD(), torch.device("cpu"))
    fused = plans[1]
    assert [p.name for p in plans] == ["dense", "g"]
    assert fused.fused and fused.options.max_capacity == 400
    assert fused.options.admission.counter_capacity == 200
    assert isinstance(fused.options.optimizer, SparseSGD)
    assert not plans[0].is_dynamic


@pytest.mark.parametrize("world, per_rank_init", [(1, 64 + 4096), (4, 64 + 1024)])
def test_fused_init_capacity_is_per_rank(world, per_rank_init):
    """A member without init_capacity (init_capacity_per_rank) starts full: its share of
    a rank's rows joins the others' per-rank init capacities."""
    plans = plan_storages([_table("a", capacity=4096, init_capacity=64),
                           _table("b", capacity=4096)], SparseSGD(), torch.device("cpu"),
                          world)
    (fused,) = plans
    assert fused.options.init_capacity == per_rank_init
    assert per_rank_options(fused.options, world).init_capacity == per_rank_init


@pytest.mark.parametrize("second, reason", [
    (_table("b", dim=16), "dim"),
    (_table("b", group=None), "no-group"),
    (_table("b", group="other"), "other-group"),
    (_table("b", optimizer=SparseAdam()), "optimizer"),
    (_table("b", dtype=torch.float16), "dtype"),
    (_table("b", score_strategy="LFU"), "score-strategy"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_tables_that_differ_keep_their_own_storage(second, reason, caplog):
    with caplog.at_level("INFO", logger="hashrec.embedding.plan"):
        assert _layout([_table("a"), second]) == {"a": ["a"], "b": ["b"]}
    field = {"dim": "dim", "optimizer": "optimizer", "dtype": "dtype",
             "score-strategy": "score_strategy"}.get(reason)
    # Tables of one group kept apart say why; tables of other groups say nothing.
    assert caplog.messages == ([f"feature group 'g': its dynamic tables take 2 storages "
                                f"(a | b): their options differ in {field}"] if field else [])


def test_a_storage_choice_spelled_out_does_not_split_a_fusion():
    # one config sets cache_load_factor: 1.0 (the default) explicitly, the other does not
    plans = plan_storages([_table("a", set_by_user={"cache_load_factor"}), _table("b")],
                          SparseSGD(), torch.device("cpu"))
    assert [[t.name for t in p.tables] for p in plans] == [["a", "b"]]
    assert plans[0].options.set_by_user == {"cache_load_factor"}


def test_several_fusable_subgroups_get_numbered_names():
    tables = [_table("a"), _table("b"), _table("c", dim=4), _table("d", dim=4)]
    assert _layout(tables) == {"g_0": ["a", "b"], "g_1": ["c", "d"]}


def test_frozen_and_trainable_tables_do_not_fuse():
    frozen = EmbeddingTableSpec("b", 8, dynamic=_table("x").dynamic, fusion_group="g",
                                trainable=False)
    assert _layout([_table("a"), frozen]) == {"a": ["a"], "b": ["b"]}


def test_truncated_normals_cut_elsewhere_keep_their_own_storage():
    def truncated(name, **bounds):
        init = InitializerArgs(mode="TRUNCATED_NORMAL", std_dev=0.05, **bounds)
        return EmbeddingTableSpec(name, 8, fusion_group="g", dynamic=TableOptions(
            dim=8, max_capacity=128, initializer=init))

    assert _layout([truncated("a", lower=0.0), truncated("b")]) == {"a": ["a"], "b": ["b"]}
    assert _layout([truncated("a", lower=0.0), truncated("b", lower=0.0)]) == {"g": ["a", "b"]}


def test_default_uniform_bounds_follow_each_tables_capacity(caplog):
    def uniform(name, capacity):
        return EmbeddingTableSpec(name, 8, dynamic=TableOptions(dim=8, max_capacity=capacity),
                                  fusion_group="g")

    with caplog.at_level("INFO", logger="hashrec.embedding.plan"):
        assert _layout([uniform("a", 64), uniform("b", 128)]) == {"a": ["a"], "b": ["b"]}
    assert caplog.messages == [
        "feature group 'g': its dynamic tables take 2 storages (a | b): their options differ "
        "in initializer (UNIFORM bounds default to +-sqrt(1/max_capacity): set them, or "
        "another initializer, alike to fuse the tables)"]
    assert _layout([uniform("a", 64), uniform("b", 64)]) == {"g": ["a", "b"]}


@pytest.mark.parametrize("field", ["initializer", "eval_initializer", "admission.initializer"])
def test_a_crossed_uniform_bound_names_the_table_and_initializer(field):
    crossed = InitializerArgs(mode="UNIFORM", upper=-0.5)  # below the default lower bound
    if field == "admission.initializer":
        kwargs = {"admission": AdmissionOptions(threshold=2, initializer=crossed)}
    else:
        kwargs = {field: crossed}
    options = TableOptions(dim=8, max_capacity=1000, **kwargs)
    with pytest.raises(EmbeddingError, match=rf"^table 'user_id': {field}: lower=-0.03"):
        plan_storages([EmbeddingTableSpec("user_id", 8, dynamic=options)], SparseSGD(),
                      torch.device("cpu"))

import dataclasses
import itertools
import logging

import pytest
import torch

from hashrec.distributed.cost_model import CostModel
from hashrec.distributed.errors import DistributedError, PlannerError
from hashrec.distributed.planner import (
    LOAD_FACTORS,
    enumerate_variants,
    plan_tables,
    plan_to_table,
)
from hashrec.distributed.storage_estimate import PlannerTable, variant_bytes
from hashrec.distributed.topology import Topology, detect_topology
from hashrec.table import (
    AdmissionOptions,
    SparseAdam,
    SparseRowWiseAdagrad,
    StorageMode,
    TableOptions,
)
from hashrec.table.memory import estimate_table_bytes

MiB = 1 << 20
_OPTIMIZERS = {0: None, 1: SparseRowWiseAdagrad(lr=0.1), 2: SparseAdam(lr=0.01)}


def _table(name="t", rows=1 << 20, dim=16, optimizer=2, cache_load_factor=None, caching=None,
           **options):
    fixed = {}
    if cache_load_factor is not None:
        fixed.update(cache_load_factor=cache_load_factor)
    if caching is not None:
        fixed.update(caching=caching)
    table_options = TableOptions(dim=dim, max_capacity=rows, optimizer=_OPTIMIZERS[optimizer],
                                 **fixed, **options)
    return PlannerTable(name=name, options=table_options,
                        fixed_cache_load_factor=cache_load_factor is not None,
                        fixed_caching=caching is not None)


def _tables(n):
    return [_table(f"t{i}", rows=(1 + i % 5) << 18, dim=8 * (1 + i % 4), optimizer=i % 3)
            for i in range(n)]


def _sizes(tables):
    """(index bytes, value bytes) of all tables together."""
    full = [t.full_estimate() for t in tables]
    return sum(f["index"] for f in full), sum(f["values"] for f in full)


def _budgets(tables, gpu_share, host_share):
    """GPU budget = index + gpu_share of the values; host budget = host_share of the values."""
    index, values = _sizes(tables)
    return Topology(gpu_bytes=int(index + gpu_share * values), host_bytes=int(host_share * values))


def _smallest(table):
    return min(enumerate_variants(table, 1024), key=lambda v: (v.gpu_bytes, v.host_bytes))


def test_variants_unfixed_cover_both_modes_and_every_factor():
    variants = enumerate_variants(_table(), batch_size=1024)
    keys = {(v.mode, v.cache_load_factor) for v in variants}
    expected = {(m, f) for m in (StorageMode.HYBRID, StorageMode.CACHING) for f in LOAD_FACTORS[:-1]}
    assert keys == expected | {(StorageMode.HBM_ONLY, 1.0)}
    assert len(variants) == 19  # 2 modes x 10 factors, the two at 1.0 are one HBM_ONLY


@pytest.mark.parametrize("clf,caching,expected", [
    (0.3, None, {(StorageMode.HYBRID, 0.3), (StorageMode.CACHING, 0.3)}),
    (0.3, True, {(StorageMode.CACHING, 0.3)}),
    (1.0, None, {(StorageMode.HBM_ONLY, 1.0)}),
    (None, False, {(StorageMode.HYBRID, f) for f in LOAD_FACTORS[:-1]}
     | {(StorageMode.HBM_ONLY, 1.0)}),
], ids=["clf0.3", "clf0.3-caching", "clf1.0", "hybrid-only"])
def test_variants_fixed_choices(clf, caching, expected):
    table = _table(cache_load_factor=clf, caching=caching)
    assert {(v.mode, v.cache_load_factor) for v in enumerate_variants(table, 1024)} == expected


@pytest.mark.parametrize("mode,clf", [(StorageMode.HBM_ONLY, 1.0), (StorageMode.HYBRID, 0.3),
                                      (StorageMode.CACHING, 0.3)], ids=["hbm", "hybrid", "caching"])
def test_variant_bytes_are_the_tables_own_estimate(mode, clf):
    admission = AdmissionOptions(threshold=2, counter_capacity=512)
    table = _table(rows=1000, dim=4, admission=admission)
    options = TableOptions(dim=4, max_capacity=1000, optimizer=SparseAdam(lr=0.01),
                           admission=admission, cache_load_factor=clf,
                           caching=mode is StorageMode.CACHING)
    expected = estimate_table_bytes(options)
    assert variant_bytes(table, mode, clf) == (expected["gpu"], expected["host"])
    variants = {(v.mode, v.cache_load_factor): v for v in enumerate_variants(table, 64)}
    chosen = variants[(mode, clf)]
    assert (chosen.gpu_bytes, chosen.host_bytes) == (expected["gpu"], expected["host"])


def test_hybrid_and_caching_split_values():
    table = _table(rows=4096, dim=8)
    full = table.full_estimate()
    hbm_gpu, hbm_host = variant_bytes(table, StorageMode.HBM_ONLY, 1.0)
    hyb_gpu, hyb_host = variant_bytes(table, StorageMode.HYBRID, 0.5)
    cac_gpu, cac_host = variant_bytes(table, StorageMode.CACHING, 0.5)
    assert hbm_host == 0 and hbm_gpu == full["values"] + full["index"]
    assert hyb_gpu == cac_gpu < hbm_gpu
    assert hyb_gpu + hyb_host == hbm_gpu
    assert cac_host == full["values"]


def test_costs_order_modes():
    variants = {(v.mode, v.cache_load_factor): v.cost for v in enumerate_variants(_table(), 8192)}
    hbm = variants[(StorageMode.HBM_ONLY, 1.0)]
    hybrid = [variants[(StorageMode.HYBRID, f)] for f in LOAD_FACTORS[:-1]]
    caching = [variants[(StorageMode.CACHING, f)] for f in LOAD_FACTORS[:-1]]
    assert all(a > b for a, b in zip(hybrid, hybrid[1:]))  # more on GPU -> cheaper
    assert all(a > b for a, b in zip(caching, caching[1:]))
    assert all(c < h for c, h in zip(caching, hybrid))  # hot rows cached beat a hash split
    assert hbm < min(caching)


def test_a_frozen_table_is_priced_as_reads():
    """Training lookups of a frozen table read rows: no optimizer traffic, no write-back;
    they cost what an evaluation's lookups of the trained twin cost."""
    trained = dataclasses.replace(_table(), name="trained")
    frozen = dataclasses.replace(trained, name="frozen", trainable=False)
    evaluated = enumerate_variants(trained, 8192, CostModel(training=False))
    for mine, twin, read in zip(enumerate_variants(frozen, 8192),
                                enumerate_variants(trained, 8192), evaluated):
        assert (mine.mode, mine.cache_load_factor) == (twin.mode, twin.cache_load_factor)
        assert mine.cost == pytest.approx(read.cost) and mine.cost < twin.cost
    with pytest.raises(ValueError, match="trainable"):
        dataclasses.replace(trained, trainable=1)


def test_generous_budgets_give_hbm_only():
    plan = plan_tables(_tables(10), Topology(gpu_bytes=1 << 40, host_bytes=1 << 40), 4096)
    assert {t.variant.mode for t in plan.tables} == {StorageMode.HBM_ONLY}


@pytest.mark.parametrize("gpu_share,host_share", [(0.3, 1.0), (0.5, 0.6), (0.2, 0.85), (0.7, 0.35)],
                         ids=["gpu30-host100", "gpu50-host60", "gpu20-host85", "gpu70-host35"])
def test_budgets_respected(gpu_share, host_share):
    tables = _tables(30)
    topology = _budgets(tables, gpu_share, host_share)
    plan = plan_tables(tables, topology, 4096)
    assert plan.gpu_bytes <= topology.gpu_bytes
    assert plan.host_bytes <= topology.host_bytes
    assert [t.name for t in plan.tables] == [t.name for t in tables]
    for table, entry in zip(tables, plan.tables):
        v = entry.variant
        assert (v.gpu_bytes, v.host_bytes) == variant_bytes(table, v.mode, v.cache_load_factor)


def test_more_budget_never_costs_more():
    tables = _tables(20)
    costs = [plan_tables(tables, _budgets(tables, share, 1.0), 4096).cost
             for share in (0.2, 0.5, 1.0)]
    assert costs[0] >= costs[1] >= costs[2]


def test_search_close_to_exhaustive_on_a_small_instance():
    tables = [_table("a", rows=1 << 16, dim=8), _table("b", rows=1 << 18, dim=32, optimizer=1),
              _table("c", rows=1 << 17, dim=16, cache_load_factor=0.5)]
    variants = [enumerate_variants(t, 2048) for t in tables]
    topology = _budgets(tables, 0.45, 0.7)
    best = min(
        sum(v.cost for v in combo) for combo in itertools.product(*variants)
        if sum(v.gpu_bytes for v in combo) <= topology.gpu_bytes
        and sum(v.host_bytes for v in combo) <= topology.host_bytes)
    plan = plan_tables(tables, topology, 2048)
    # The search is heuristic; on this instance it must land within 5% of the optimum.
    assert best <= plan.cost <= 1.05 * best


def test_fixed_cache_load_factor_honoured():
    tables = [_table("fixed", cache_load_factor=0.3), _table("free")]
    plan = plan_tables(tables, Topology(gpu_bytes=1 << 40, host_bytes=1 << 40), 4096)
    assert plan.for_table("fixed").cache_load_factor == 0.3
    assert plan.for_table("fixed").mode in (StorageMode.HYBRID, StorageMode.CACHING)
    assert plan.for_table("free").mode is StorageMode.HBM_ONLY


def test_fixed_caching_honoured_under_pressure():
    tables = [_table("cached", caching=True), _table("other")]
    plan = plan_tables(tables, _budgets(tables, 0.4, 2.0), 4096)
    assert plan.for_table("cached").mode in (StorageMode.CACHING, StorageMode.HBM_ONLY)
    assert plan.gpu_bytes <= plan.topology.gpu_bytes


def test_gpu_error_names_the_tables_and_bytes():
    tables = [_table("small", rows=1 << 10), _table("huge_a", rows=1 << 22),
              _table("huge_b", rows=1 << 22)]
    budget = _smallest(tables[0]).gpu_bytes + 1000
    with pytest.raises(PlannerError) as info:
        plan_tables(tables, Topology(gpu_bytes=budget, host_bytes=1 << 40), 1024)
    message = str(info.value)
    assert "GPU budget" in message and "huge_a" in message and "huge_b" in message
    assert "small (" not in message
    short = sum(_smallest(t).gpu_bytes for t in tables) - budget
    assert f"short by {short} bytes" in message or f"({short} bytes)" in message


def test_host_error_when_nothing_fits_host():
    tables = [_table("a", cache_load_factor=0.2, caching=True),
              _table("b", cache_load_factor=0.2, caching=True)]
    with pytest.raises(PlannerError, match=r"host budget.*\ba \(") as info:
        plan_tables(tables, Topology(gpu_bytes=1 << 40, host_bytes=MiB), 1024)
    assert "b (" in str(info.value)


def test_joint_error_when_budgets_conflict():
    tables = [_table("a"), _table("b")]
    # Each budget alone can be met, but values need GPU + host >= all values.
    with pytest.raises(PlannerError, match="cannot both be met.*short by"):
        plan_tables(tables, _budgets(tables, 0.5, 0.3), 1024)


def test_empty_and_invalid_input():
    topology = Topology(gpu_bytes=MiB, host_bytes=MiB)
    assert plan_tables([], topology, 8).tables == ()
    with pytest.raises(ValueError, match="repeated: t"):
        plan_tables([_table("t"), _table("t")], topology, 8)
    with pytest.raises(ValueError, match="batch_size"):
        plan_tables([_table("t")], topology, 0)
    with pytest.raises(ValueError, match="ids_per_sample"):
        PlannerTable(name="t", options=TableOptions(dim=4, max_capacity=8), ids_per_sample=-1)
    with pytest.raises(ValueError, match="host_bandwidth"):
        CostModel(host_bandwidth=0)
    with pytest.raises(ValueError, match="gpu_bytes"):
        Topology(gpu_bytes=-1, host_bytes=0)


def test_sharded_divides_capacities_and_keeps_fixed_choices():
    options = TableOptions(dim=16, max_capacity=1 << 20, init_capacity=1 << 16,
                           optimizer=SparseAdam(lr=0.01),
                           admission=AdmissionOptions(threshold=2, counter_capacity=1 << 16),
                           cache_load_factor=0.4, caching=True)
    table = PlannerTable.sharded("ids", options, world_size=4, fixed_cache_load_factor=True)
    assert (table.rows, table.options.init_capacity) == (1 << 18, 1 << 16)  # init is per rank
    assert table.options.admission.counter_capacity == 1 << 14
    assert table.cache_load_factor == 0.4 and table.caching is None
    assert PlannerTable.sharded("ids", options, world_size=4).cache_load_factor is None
    with pytest.raises(ValueError, match="world_size"):
        PlannerTable.sharded("ids", options, world_size=0)
    large_init = dataclasses.replace(options, init_capacity=1 << 20)
    assert PlannerTable.sharded("ids", large_init, world_size=4).options.init_capacity == 1 << 18


def test_plan_to_table_lists_every_table():
    tables = [*_tables(2), PlannerTable.sharded("sharded", TableOptions(dim=8, max_capacity=1001),
                                                world_size=4)]
    plan = plan_tables(tables, Topology(gpu_bytes=1 << 40, host_bytes=1 << 40), 512)
    lines = plan_to_table(plan).splitlines()
    assert lines[0].split()[:5] == ["table", "mode", "load", "factor", "rows/rank"]
    assert [entry.rows for entry in plan.tables] == [1 << 18, 2 << 18, 251]
    for entry in plan.tables:
        row = next(line for line in lines if line.startswith(entry.name + " "))
        assert row.split()[:4] == [entry.name, entry.variant.mode.value,
                                   f"{entry.variant.cache_load_factor:g}", str(entry.rows)]
        assert str(entry.variant.gpu_bytes) in row
    assert any(line.startswith("total") for line in lines)
    quarter = dataclasses.replace(plan.tables[0], variant=dataclasses.replace(
        plan.tables[0].variant, cache_load_factor=0.25))
    row = plan_to_table(dataclasses.replace(plan, tables=(quarter,))).splitlines()[2]
    assert row.split()[2] == "0.25"  # as the table keeps it, not rounded to 0.2


def test_without_cuda_both_tiers_fit_the_one_host_budget():
    # On the CPU a HYBRID table's two tiers are the same memory: a budget of 3/4 of the
    # table's bytes holds no split of it (with two budgets, one on a GPU, 0.5 would fit).
    table = _table(rows=1 << 18)
    whole = sum(variant_bytes(table, StorageMode.HBM_ONLY, 1.0))
    cpu = detect_topology(1, "cpu", env={"HASHREC_HOST_MEMORY_BYTES": str(whole * 3 // 4)})
    with pytest.raises(PlannerError, match=r"host \(without CUDA: GPU and host tiers together\) "
                                           r"budget .* short by"):
        plan_tables([table], cpu, 1024)
    assert cpu.shared_memory and cpu.gpu_bytes == cpu.host_bytes
    split = plan_tables([table], dataclasses.replace(cpu, shared_memory=False), 1024)
    assert split.for_table("t").mode is not StorageMode.HBM_ONLY
    assert split.gpu_bytes + split.host_bytes > cpu.host_bytes
    # A GPU budget set on the CPU bounds the device tier; the host budget bounds both.
    cpu = detect_topology(1, "cpu", env={"HASHREC_HOST_MEMORY_BYTES": str(whole * 3 // 2),
                                         "HASHREC_GPU_MEMORY_BYTES": str(whole // 2)})
    plan = plan_tables([table], cpu, 1024)
    assert plan.gpu_bytes <= whole // 2 < whole <= plan.gpu_bytes + plan.host_bytes
    assert plan.gpu_bytes + plan.host_bytes <= whole * 3 // 2
    assert f"GPU + host bytes {plan.gpu_bytes + plan.host_bytes} within the host budget" \
        in plan_to_table(plan)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_tables_need_half_the_value_bytes(dtype):
    full, half = _table(dim=16), _table(dim=16, dtype=dtype)  # Adam rows: 48 columns
    assert (full.element_bytes, half.element_bytes) == (4, 2)
    assert half.full_estimate()["values"] * 2 == full.full_estimate()["values"]
    assert half.full_estimate()["index"] == full.full_estimate()["index"]
    for mode, factor in ((StorageMode.HYBRID, 0.3), (StorageMode.CACHING, 0.5)):
        half_host, full_host = (variant_bytes(t, mode, factor)[1] for t in (half, full))
        assert abs(half_host * 2 - full_host) <= 1  # (the device share is rounded down)


def test_a_data_type_fp16_table_fits_where_its_float32_twin_does_not(monkeypatch):
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set
    from hashrec.train.distributed import plan_storage_modes

    def feature(name, data_type):
        return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: '
                f'"user:{name}" embedding_dim: 16 data_type: "{data_type}" dynamicemb {{ '
                f'max_capacity: 65536 }} }} }}\n')

    # Adam rows of 48 columns: 6 MiB of values in float16, 12 in float32, plus 1.3 MiB of
    # index each; a 10 MiB GPU budget holds the first whole, the second in part.
    monkeypatch.setenv("HASHREC_GPU_MEMORY_BYTES", str(10 * MiB))
    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", str(1 << 30))
    for data_type, whole in (("FP16", True), ("FP32", False)):
        feature_set = build_feature_set(parse_pipeline_config(
            'model_dir: "m"\n' + feature("a", data_type)))
        modes = plan_storage_modes(feature_set, SparseAdam(lr=0.01), 256, None)
        assert (modes["a"][0] == 1.0) is whole, (data_type, modes)


def _planned_from_config(monkeypatch, dynamicemb: str, gpu_bytes: int = 1 << 40):
    """plan_storage_modes of a one-feature config (the path train_eval takes)."""
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set
    from hashrec.train.distributed import plan_storage_modes

    monkeypatch.setenv("HASHREC_GPU_MEMORY_BYTES", str(gpu_bytes))
    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", str(1 << 40))
    feature_set = build_feature_set(parse_pipeline_config(
        'model_dir: "m"\nfeature_configs { id_feature { feature_name: "user_id" expression: '
        '"user:user_id" embedding_dim: 16 dynamicemb { max_capacity: 65536 '
        f'{dynamicemb} }} }} }}'))
    return plan_storage_modes(feature_set, SparseAdam(lr=0.01), 256, None)["user_id"]


@pytest.mark.parametrize("purpose, label", [
    ("training", "training batch 256 per rank"),
    ("evaluation", "evaluation batch 256 per rank"),
    ("export", "export (costs estimated at batch 256 per rank)")])
def test_the_plan_line_says_what_the_process_plans_for(monkeypatch, caplog, purpose, label):
    from hashrec.config import parse_pipeline_config
    from hashrec.features import build_feature_set
    from hashrec.train.distributed import plan_storage_modes

    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", str(1 << 40))
    feature_set = build_feature_set(parse_pipeline_config(
        'model_dir: "m"\nfeature_configs { id_feature { feature_name: "user_id" expression: '
        '"user:user_id" embedding_dim: 16 dynamicemb { max_capacity: 65536 } } }'))
    with caplog.at_level(logging.INFO, logger="hashrec.train"):
        plan_storage_modes(feature_set, SparseAdam(lr=0.01), 256, None, purpose)
    assert [m.split(":")[0] for m in caplog.messages if m.startswith("storage plan")] == [
        f"storage plan for 1 rank(s), {label}"]


@pytest.mark.parametrize("dynamicemb, planned", [
    ("cache_load_factor: 0.5 caching: false", (0.5, False)),
    ("cache_load_factor: 0.5 caching: true", (0.5, True)),
], ids=["hybrid", "caching"])
def test_a_config_fixing_factor_and_mode_gets_both(monkeypatch, dynamicemb, planned):
    # Unconstrained, the planner prices CACHING at 0.5 below HYBRID: only the fixed mode
    # makes it HYBRID.
    assert _planned_from_config(monkeypatch, "cache_load_factor: 0.5") == (0.5, True)
    assert _planned_from_config(monkeypatch, dynamicemb) == planned


# 2.9 MB: the 13.3 MiB table fits only partly on the GPU (its 1.3 MiB index included).
SMALL_GPU = 3_000_000


def test_an_explicit_cache_load_factor_of_one_is_kept(monkeypatch):
    factor, _ = _planned_from_config(monkeypatch, "", SMALL_GPU)
    assert factor < 1.0  # left to the planner, the table spills to host memory
    with pytest.raises(DistributedError, match=r"user_id \(needs .*fixed: cache_load_factor 1\)"
                                               r".*leave the fixed cache_load_factor"):
        _planned_from_config(monkeypatch, "cache_load_factor: 1.0", SMALL_GPU)


@pytest.mark.parametrize("caching", [False, True], ids=["hybrid", "caching"])
def test_an_explicit_caching_alone_fixes_the_mode(monkeypatch, caching):
    factor, planned = _planned_from_config(monkeypatch, f"caching: {str(caching).lower()}",
                                           SMALL_GPU)
    assert factor < 1.0 and planned is caching


def test_planning_leaves_the_fusion_split_note_to_the_collection(monkeypatch, caplog):
    """The planner plans the storages that the embedding collection then builds: the line
    saying why a group's tables take several storages is logged once, by the collection."""
    from hashrec.config import parse_pipeline_config
    from hashrec.embedding import EmbeddingCollection
    from hashrec.features import build_feature_set
    from hashrec.train.distributed import plan_storage_modes

    monkeypatch.setenv("HASHREC_HOST_MEMORY_BYTES", str(1 << 40))
    features = "".join(
        f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{name}" '
        f'embedding_dim: 8 dynamicemb {{ max_capacity: 1024 score_strategy: "{strategy}" }} '
        f'}} }}\n' for name, strategy in (("a", "LFU"), ("b", "STEP")))
    group = ('model_config { feature_groups { group_name: "g" feature_names: ["a", "b"] '
             'group_type: DEEP } }\n')
    feature_set = build_feature_set(parse_pipeline_config('model_dir: "m"\n' + features + group))
    with caplog.at_level("INFO", logger="hashrec.embedding.plan"):
        modes = plan_storage_modes(feature_set, SparseAdam(lr=0.01), 256, None)
        EmbeddingCollection(feature_set.embedding_tables(), feature_set.embedding_features(),
                            SparseAdam(lr=0.01), torch.device("cpu"), storage_modes=modes)
    notes = [m for m in caplog.messages if "take 2 storages" in m]
    assert notes == ["feature group 'g': its dynamic tables take 2 storages (a | b): their "
                     "options differ in score_strategy"]

"""bench_train's trainer runner: a trainer that wrote its results but hangs at exit is
ended after a grace period, its results kept; a trainer that fails still fails."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_train  # noqa: E402


def test_a_trainer_hanging_after_its_results_is_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_train, "EXIT_GRACE_S", 1)
    done = tmp_path / "step_timing.json"
    script = (f"import time; print('step 1 | loss 0.5 | a2a 2.5 ms/step', flush=True); "
              f"open({str(done)!r}, 'w').write('{{}}'); time.sleep(120)")
    assert bench_train._run_logged([sys.executable, "-c", script], dict(os.environ),
                                   str(done)) == [2.5]


def test_a_failing_trainer_still_fails(tmp_path):
    script = "import sys; print('no results', flush=True); sys.exit(3)"
    with pytest.raises(RuntimeError, match="exit code 3"):
        bench_train._run_logged([sys.executable, "-c", script], dict(os.environ),
                                str(tmp_path / "step_timing.json"))


def test_markdown_lists_each_ranks_phases_and_worst_window():
    def summary(emb_fwd, worst_fwd, share):
        return {"phases_ms": {"embedding_forward": emb_fwd, "step": 8.0},
                "windows": [{"global_samples_per_second": 2.0e6,
                             "phases_ms": {"embedding_forward": emb_fwd}},
                            {"global_samples_per_second": 1.5e6,
                             "phases_ms": {"embedding_forward": worst_fwd}}],
                "host_threads": {"main_thread_cpu_share": share}}
    rank0, rank1 = summary(2.1, 3.3, 0.73), summary(1.7, 2.5, 0.81)
    lines = bench_train._rank_lines({"dynamicemb": {**rank0, "ranks": [rank0, rank1]}})
    rows = [line for line in lines if line.startswith("| dynamicemb")]
    assert [row.split(" | ")[1] for row in rows] == ["0", "1"]
    assert "| 2.10 |" in rows[0] and "| 3.30 |" in rows[0] and rows[0].endswith("73% |")
    assert "| 1.70 |" in rows[1] and "| 2.50 |" in rows[1] and rows[1].endswith("81% |")
    assert bench_train._rank_lines({"dynamicemb": rank0}) == []


def test_the_dlrm_hstu_baseline_has_num_buckets_tables_where_the_example_has_dynamicemb(
        tmp_path):
    from hashrec.config.loader import load_pipeline_config
    from hashrec.tools.gen_kuairand_data import num_videos

    args = bench_train.parse_args(["--configs", "dlrm_hstu", "--kuairand_rows", "5000"])
    path = bench_train.num_buckets_config(args, "dlrm_hstu", str(tmp_path))

    def id_features(config):
        for feature in config.feature_configs:
            inner = getattr(feature, feature.WhichOneof("feature"))
            members = [getattr(f, f.WhichOneof("feature")) for f in inner.features] \
                if feature.HasField("sequence_feature") else [inner]
            yield from (m for m in members if "num_buckets" in m.DESCRIPTOR.fields_by_name)

    example = list(id_features(load_pipeline_config(bench_train.CONFIGS["dlrm_hstu"])))
    baseline = list(id_features(load_pipeline_config(path)))
    assert any(f.HasField("dynamicemb") for f in example)
    assert [f.feature_name for f in baseline] == [f.feature_name for f in example]
    expected = {"user:user_id": 5000, "item:video_id": num_videos(0.01)}
    for old, new in zip(example, baseline):
        assert not new.HasField("dynamicemb") and new.embedding_dim == old.embedding_dim
        if old.HasField("dynamicemb"):
            assert new.num_buckets == expected[old.expression]
        else:
            assert new.num_buckets == old.num_buckets
    text = bench_train.markdown({
        "environment": {"date": "d", "gpu": "g", "cpus": 2, "torch": "t", "triton": "t",
                        "python": "p"},
        "nproc": 1, "command": "c", "num_rows": 10, "batch_size": 2, "mixed_precision": "FP32",
        "num_workers": 0, "warmup_steps": 1, "sequence_format": None, "kuairand_rows": 5000,
        "runs": {"dlrm_hstu": {}, "dlrm_hstu_num_buckets": {}},
        "ratio_dlrm_hstu_dynamicemb_over_num_buckets": 0.75})
    assert "KuaiRand-like data at scale 0.01 (5000 rows)" in text
    assert "sequence length 100" not in text
    assert "dlrm_hstu dynamicemb / num_buckets throughput" in text and "0.750" in text


def test_the_hstu_match_baseline_takes_the_num_buckets_examples_sizes_and_its_item_table(
        tmp_path):
    from hashrec.config.loader import load_pipeline_config

    args = bench_train.parse_args(["--configs", "hstu_match"])
    baseline = load_pipeline_config(bench_train.num_buckets_config(args, "hstu_match",
                                                                   str(tmp_path)))
    example = load_pipeline_config(bench_train.CONFIGS["hstu_match"])
    sizes = {m.expression: m.num_buckets for m in
             bench_train._id_members(load_pipeline_config(bench_train.CONFIGS["num_buckets"]))
             if m.num_buckets}
    pairs = list(zip(bench_train._id_members(example), bench_train._id_members(baseline),
                     strict=True))
    assert sum(old.HasField("dynamicemb") for old, _ in pairs) >= 5
    for old, new in pairs:
        assert new.feature_name == old.feature_name and not new.HasField("dynamicemb")
        if old.HasField("dynamicemb"):
            assert new.num_buckets == sizes[old.expression], old.feature_name
        elif old.num_buckets or old.hash_bucket_size:
            assert (new.num_buckets, new.hash_bucket_size) == (old.num_buckets,
                                                               old.hash_bucket_size)
        else:  # a sequence's sub-feature sharing a top-level table: that table's size
            assert new.num_buckets in (0, sizes[old.expression]), old.feature_name
    # its negatives come from the item table generated beside the training rows, for the
    # baseline as for the example; the other configs' samplers are left alone
    data = os.path.join("data", "bench_train_taobao_items_10", "train")
    for name in ("hstu_match", "hstu_match_num_buckets"):
        argv = bench_train.train_argv(args, name, data, "m", 1, "c.config")
        changes = json.loads(argv[argv.index("--edit_config_json") + 1])
        assert changes["data_config.negative_sampler.input_path"] == os.path.join(
            "data", "bench_train_taobao_items_10", "items")
    argv = bench_train.train_argv(args, "dynamicemb", "d", "m", 1)
    assert "negative_sampler" not in argv[argv.index("--edit_config_json") + 1]

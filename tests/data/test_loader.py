import os

import pytest

from hashrec.config import load_pipeline_config
from hashrec.data import DataError, create_dataloader, csv_format, read_options
from hashrec.features import build_feature_set
from hashrec.tools.gen_taobao_data import generate

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(scope="module")
def taobao(tmp_path_factory):
    out = tmp_path_factory.mktemp("taobao")
    generate(str(out), num_rows=3000, num_files=2, seed=0, scale=0.01, eval_rows=1000,
             row_group_size=700, quiet=True)
    return str(out)


@pytest.mark.parametrize("config", ["multi_tower_din_taobao.config",
                                    "multi_tower_din_taobao_dynamicemb.config"],
                         ids=["num_buckets", "dynamicemb"])
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "workers2"])
def test_example_configs_read_generated_taobao_data(taobao, config, workers):
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, config))
    features = build_feature_set(pipeline)
    loader = create_dataloader(pipeline.data_config, features, f"{taobao}/train", "train",
                               batch_size=512, num_workers=workers)
    batches = list(loader)
    assert sum(b.batch_size for b in batches) == 3000
    keys = set(batches[0].sparse.keys())
    assert {"user_id", "adgroup_id", "click_50_seq__brand"} <= keys
    assert set(batches[0].labels) == {"clk"}
    evaluation = create_dataloader(pipeline.data_config, features, f"{taobao}/eval", "eval",
                                   batch_size=512, num_workers=workers)
    assert sum(b.batch_size for b in evaluation) == 1000


def test_forkserver_workers_give_the_same_batches(taobao):
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    features = build_feature_set(pipeline)

    def read(start_method):
        loader = create_dataloader(pipeline.data_config, features, f"{taobao}/train", "train",
                                   batch_size=512, num_workers=2, start_method=start_method)
        return [(b.sparse.values().tolist(), b.labels["clk"].tolist()) for b in loader]

    assert read("forkserver") == read("fork")
    with pytest.raises(DataError, match="start method"):
        create_dataloader(pipeline.data_config, features, f"{taobao}/train", "train",
                          num_workers=2, start_method="teleport")


def test_proto_data_config_enums_are_read(taobao):
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    cfg = pipeline.data_config
    opts = read_options(cfg, "eval")
    assert opts.batch_size == cfg.batch_size and not opts.shuffle
    cfg.dataset_type = cfg.DESCRIPTOR.fields_by_name["dataset_type"].enum_type.values_by_name[
        "KafkaDataset"].number
    with pytest.raises(DataError, match="KafkaDataset is not supported"):
        create_dataloader(cfg, build_feature_set(pipeline), f"{taobao}/eval", "eval")


def test_read_options_reject_bad_values():
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    with pytest.raises(ValueError, match="mode"):
        read_options(pipeline.data_config, "serve")
    with pytest.raises(ValueError, match="rank"):
        read_options(pipeline.data_config, "train", rank=2, world_size=2)


def test_bad_csv_layout_in_the_config_is_a_data_error():
    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    cfg = pipeline.data_config
    cfg.delimiter, cfg.with_header = "||", True
    with pytest.raises(DataError, match="data_config.*delimiter must be one character"):
        csv_format(cfg)


def _record_affinity(init, out_dir, worker_id):
    init(worker_id)
    with open(os.path.join(out_dir, f"worker{worker_id}"), "w") as f:
        f.write(",".join(str(c) for c in sorted(os.sched_getaffinity(0))))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_workers_run_on_the_given_cores(taobao, tmp_path):
    import functools

    pipeline = load_pipeline_config(os.path.join(EXAMPLES, "multi_tower_din_taobao.config"))
    cores = (min(os.sched_getaffinity(0)),)
    loader = create_dataloader(pipeline.data_config, build_feature_set(pipeline),
                               f"{taobao}/train", "train", batch_size=512, num_workers=2,
                               start_method="fork", worker_cores=cores)
    loader.worker_init_fn = functools.partial(_record_affinity, loader.worker_init_fn,
                                              str(tmp_path))
    assert sum(b.batch_size for b in loader) == 3000
    assert sorted(os.listdir(tmp_path)) == ["worker0", "worker1"]
    for name in os.listdir(tmp_path):
        assert (tmp_path / name).read_text() == str(cores[0])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity")
def test_the_worker_count_is_checked_against_the_workers_cores():
    import warnings

    from hashrec.data.loader import BatchLoader

    more = len(os.sched_getaffinity(0)) + 1  # more workers than this process's cores
    with pytest.warns(UserWarning, match="suggested max number of worker"):
        BatchLoader(list(range(4)), batch_size=None, num_workers=more)
    with warnings.catch_warnings():  # the workers have cores of their own: no warning
        warnings.simplefilter("error")
        BatchLoader(list(range(4)), batch_size=None, num_workers=more,
                    worker_cores=tuple(range(more)))
    with pytest.warns(UserWarning, match="3 loader workers share 1 cores"):
        BatchLoader(list(range(4)), batch_size=None, num_workers=3, worker_cores=(0,))


def _signalled_worker(conn) -> None:
    import os
    import signal

    from hashrec.data.loader import _init_worker

    _init_worker(None, 0)
    os.kill(os.getpid(), signal.SIGINT)  # ignored: Ctrl-C reaches the process group
    os.kill(os.getpid(), signal.SIGTERM)  # the first one leaves the worker running
    conn.send("alive")
    os.kill(os.getpid(), signal.SIGTERM)  # the second one ends it
    conn.send("still alive")


def test_workers_outlast_a_first_sigint_and_sigterm():
    import multiprocessing
    import signal

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_signalled_worker, args=(send,))
    worker.start()
    worker.join(timeout=60)
    assert receive.recv() == "alive" and not receive.poll()
    assert worker.exitcode == -signal.SIGTERM


def test_input_column_names_are_every_files_columns_unread(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hashrec.config import data_pb2
    from hashrec.data.loader import input_column_names

    pq.write_table(pa.table({"a": [1], "b": [2]}), tmp_path / "one.parquet")
    pq.write_table(pa.table({"b": [3], "c": [4]}), tmp_path / "two.parquet")
    (tmp_path / "empty.parquet").write_bytes(b"")
    config = data_pb2.DataConfig(dataset_type=data_pb2.ParquetDataset)
    assert input_column_names(config, str(tmp_path / "*.parquet")) == ["a", "b", "c"]
    (tmp_path / "head.csv").write_text("x;y\n1;2\n")
    (tmp_path / "blank.csv").write_text("")
    config = data_pb2.DataConfig(dataset_type=data_pb2.CsvDataset, delimiter=";",
                                 with_header=True)
    assert input_column_names(config, str(tmp_path / "*.csv")) == ["x", "y"]
    (tmp_path / "rows.csv").write_text("1;2\n")
    config.with_header = False
    config.input_fields.add(input_name="p")
    config.input_fields.add(input_name="q")
    assert input_column_names(config, str(tmp_path / "rows.csv")) == ["p", "q"]
    with pytest.raises(DataError, match="not a readable parquet file"):
        input_column_names(data_pb2.DataConfig(dataset_type=data_pb2.ParquetDataset),
                           str(tmp_path / "head.csv"))

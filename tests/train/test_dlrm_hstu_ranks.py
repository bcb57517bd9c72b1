"""dlrm_hstu on two CPU ranks (gloo) over ``test_dlrm_hstu_learns``' KuaiRand-like rows,
every id table dynamic and so sharded between the ranks (the histories' and the
candidates' video ids and categories and the contextual ids travel to their owners and
back), with ``enable_global_average_loss``: ``train_eval`` under torchrun learns the clicks
from the history (the same training with every row's history another row's learns nothing)
and saves a shard of every table a rank. The checkpoint restores on two ranks into the
model that evaluates as training's last evaluation did, and into one process, which
evaluates and predicts every candidate as that two-rank model does and exports a model
predicting the same. The evaluation's metrics count each real candidate of the eval rows
once over both ranks: they are the metrics of every candidate, by hand. Two ranks' steps of
the training loop train each loss on its mean over both ranks' candidates: as one process
on the global batches, and not so without ``enable_global_average_loss``."""

from __future__ import annotations

import functools
import json

import pyarrow.parquet as pq
import pytest
import torch
from test_dlrm_hstu_learns import CANDIDATES, EVAL_ROWS, eager_outputs, write_data
from test_dlrm_hstu_learns import _config as dlrm_hstu_config
from two_ranks import eval_results, run_world, torchrun_train_eval

from hashrec.checkpoint import latest_checkpoint
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.config import parse_pipeline_config
from hashrec.export.exporter import export_model
from hashrec.predict import predict
from hashrec.train import evaluate_checkpoint
from hashrec.train.checkpoints import Resume
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.metrics import BinnedAUC
from hashrec.train.session import build_session

pytestmark = pytest.mark.slow

DYNAMIC = 'dynamicemb { max_capacity: 1024 initializer_args { mode: "NORMAL" std_dev: 0.1 } }'
# the dynamic storages: the video ids and categories, and the contextual ids (one storage, the
# tables of a feature group fused)
TABLES = ("contextual", "video_cat_emb", "video_id_emb")


def _text(tmp_path) -> str:
    """The one-process test's pipeline, every id table dynamic, each loss the mean over
    every rank's candidates."""
    text = dlrm_hstu_config(tmp_path, str(tmp_path / "data"), DYNAMIC)
    return text.replace("max_seq_len: 40", "max_seq_len: 40 enable_global_average_loss: true")


def _train_on_two_ranks(tmp_path, shuffled: bool) -> tuple[str, dict]:
    """(config text, rank 0's last evaluation) of train_eval on two ranks."""
    write_data(tmp_path / "data", shuffled)
    text = _text(tmp_path)
    assert parse_pipeline_config(text).model_config.dlrm_hstu.enable_global_average_loss
    (tmp_path / "pipeline.config").write_text(text, encoding="utf-8")
    # two ranks of 32 rows a step: the one-process test's 64 rows a step
    torchrun_train_eval(tmp_path / "pipeline.config", "--edit_config_json",
                        json.dumps({"data_config.batch_size": 32}))
    (result,) = eval_results(tmp_path / "model")
    return text, result


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """(tmp dir, config text, rank 0's last evaluation) of the rows learned on two ranks."""
    tmp_path = tmp_path_factory.mktemp("dlrm_hstu_ranks")
    text, result = _train_on_two_ranks(tmp_path, shuffled=False)
    return tmp_path, text, result


def test_two_ranks_learn_the_clicks_with_the_tables_sharded(two_ranks):
    tmp_path, _, result = two_ranks
    # a candidate is clicked when its category is the one most of the user's history has;
    # this run gave 0.84 (likes 0.96), one process 0.85 (0.97)
    assert result["auc_is_click"] > 0.8 and result["auc_is_like"] > 0.93, result
    assert result["num_examples"] == EVAL_ROWS  # both ranks' shares of the eval rows
    meta = read_complete_meta(latest_checkpoint(str(tmp_path / "model")))
    assert meta["world_size"] == 2 and sorted(meta["tables"]) == list(TABLES)
    for name in TABLES:
        table = meta["tables"][name]
        rows = [shard["rows"] for shard in table["shards"]]
        assert len(rows) == 2 and min(rows) > 0 and sum(rows) == table["num_rows"], name


def test_without_the_history_signal_two_ranks_learn_nothing(tmp_path):
    # every row another row's history: this run gave 0.48
    _, result = _train_on_two_ranks(tmp_path, shuffled=True)
    assert abs(result["auc_is_click"] - 0.5) < 0.08, result


# Every new row alike (the ranks insert their rows in another order than one process) and
# plain SGD (Adam's and Adagrad's first steps follow the gradients' signs alone), so that
# two ranks training on the global mean of the losses are one process on the global batches.
SAME_ROWS = 'dynamicemb { max_capacity: 1024 initializer_args { mode: "CONSTANT" value: 0.05 } }'
SGD = (("adagrad_optimizer { lr: 0.05 }", "sgd_optimizer { lr: 0.5 }"),
       ("adam_optimizer { lr: 0.003 }", "sgd_optimizer { lr: 0.5 }"))
STEPS, SHARE = 3, 32  # steps, each rank's rows a step


def _sgd_config(tmp_path, global_average: bool):
    text = dlrm_hstu_config(tmp_path, str(tmp_path / "data"), SAME_ROWS).replace(
        "max_seq_len: 40", f"max_seq_len: 40 enable_global_average_loss: "
                           f"{str(global_average).lower()}")
    for old, new in SGD:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return parse_pipeline_config(text)


def _trained_dense(tmp_path, global_average: bool, ctx=None) -> dict[str, torch.Tensor]:
    """The dense parameters after STEPS steps of the training loop on the first rows: on
    ``ctx``'s rank of two its share of each step's 2 * SHARE rows, alone all of them."""
    config = _sgd_config(tmp_path, global_average)
    torch.manual_seed(0)
    session = build_session(config, device=torch.device("cpu"), ctx=ctx)
    loop = TrainLoop(session, LoopOptions.from_config(config), Resume())
    session.model.train()
    rows = pq.read_table(tmp_path / "data" / "train")
    for step in range(STEPS):
        start, count = 2 * SHARE * step, 2 * SHARE
        if ctx is not None:
            start, count = start + SHARE * ctx.rank, SHARE
        loop.train_step(session.feature_set.parse(rows.slice(start, count)))
    return {name: value.detach().clone() for name, value in session.model.named_parameters()}


def test_two_ranks_train_on_the_global_mean_of_the_candidates_losses(two_ranks, tmp_path):
    # the ranks' rows hold different numbers of candidates: each rank's own mean, averaged
    # over the ranks, is not the mean over both ranks' candidates
    root, _, _ = two_ranks
    (tmp_path / "data").symlink_to(root / "data")
    worlds = run_world({f"{average}": functools.partial(_trained_dense, tmp_path, average)
                        for average in (True, False)}, 2, tmp_path)
    for ranks in worlds.values():
        for rank in ranks:
            assert not isinstance(rank, Exception), rank
    alone = _trained_dense(tmp_path, True)
    assert alone
    for rank in worlds["True"]:  # this run: within 3e-7
        torch.testing.assert_close(rank, alone, rtol=1e-4, atol=1e-5)
    for rank in worlds["False"]:  # each rank's own mean: this run 0.012 apart
        assert rank.keys() == alone.keys()
        assert max(float((rank[n] - alone[n]).abs().max()) for n in alone) > 1e-3


# Per-candidate metrics more than training's, with the candidates grouped by their row's
# user_active_degree (a few values, each one's rows on both ranks), every pair of the XAUCs
# taken (each candidate counted more than once, or one left out, changes them).
METRICS = (('task_bitmask: 1 metrics { auc {} }',
            'task_bitmask: 1 metrics { auc {} } '
            'metrics { grouped_auc { grouping_key: "user_active_degree" } }'),
           ('metrics { mean_absolute_error {} }',
            'metrics { mean_absolute_error {} } metrics { xauc { sample_ratio: 1 } } '
            'metrics { grouped_xauc { grouping_key: "user_active_degree" '
            'max_pairs_per_group: 100000000 } }'))


def _with_more_metrics(text: str) -> str:
    for old, new in METRICS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _restored_on_rank(text: str, checkpoint: str, eval_path: str, ctx) -> dict:
    """On a rank of two: the checkpoint's evaluation, and the outputs of every candidate
    slot (B, K) of every row of ``eval_path``."""
    config = parse_pipeline_config(text)
    result = evaluate_checkpoint(config, checkpoint, ctx=ctx,
                                 result_filename="restored_result.txt")
    return {"result": result, "outputs": eager_outputs(config, checkpoint, eval_path, ctx)}


@pytest.fixture(scope="module")
def restored(two_ranks, tmp_path_factory):
    """(checkpoint, the config text with more metrics, the two ranks' restored evaluations
    and outputs)."""
    root, text, _ = two_ranks
    checkpoint = latest_checkpoint(str(root / "model"))
    text = _with_more_metrics(text)
    scenario = functools.partial(_restored_on_rank, text, checkpoint,
                                 str(root / "data" / "eval"))
    (ranks,) = run_world({"restored": scenario}, 2,
                         tmp_path_factory.mktemp("restored")).values()
    for rank in ranks:
        assert not isinstance(rank, Exception), rank
    return checkpoint, text, ranks


def test_the_checkpoint_restores_into_one_process_as_the_two_ranks_model(two_ranks,
                                                                       restored, tmp_path):
    root, _, trained = two_ranks
    checkpoint, text, ranks = restored
    # restored on two ranks, the model evaluates as the trained one did (each rank's share
    # of the rows) and every rank computes every candidate alike, its ids looked up on their
    # owners
    for rank in ranks:
        assert rank["result"]["step"] == trained["step"]
        assert rank["result"]["num_examples"] == EVAL_ROWS
        for metric, value in trained.items():
            if metric not in ("step", "global_step", "checkpoint", "num_examples"):
                assert rank["result"][metric] == pytest.approx(value, rel=1e-6), metric
    outputs = ranks[0]["outputs"]
    torch.testing.assert_close(ranks[1]["outputs"], outputs, rtol=0, atol=0)
    # one process holds both shards: it evaluates and predicts as the two ranks
    config = parse_pipeline_config(text)
    alone = evaluate_checkpoint(config, checkpoint, result_filename="one_rank_result.txt")
    assert alone.keys() == ranks[0]["result"].keys()
    for metric, value in ranks[0]["result"].items():
        assert alone[metric] == pytest.approx(value, rel=1e-5, abs=1e-6), metric
    eval_path = str(root / "data" / "eval")
    eager = eager_outputs(config, checkpoint, eval_path)
    torch.testing.assert_close(eager, outputs, rtol=1e-6, atol=1e-6)
    # and its export predicts every candidate as it does
    export_model(config, str(tmp_path / "export"), checkpoint)
    predict(str(tmp_path / "export"), eval_path, str(tmp_path / "predicted.parquet"))
    predicted = pq.read_table(tmp_path / "predicted.parquet")
    assert sorted(predicted.column_names) == sorted(eager)
    for name, values in eager.items():
        exported = torch.tensor(predicted[name].to_pylist())
        assert exported.shape == (EVAL_ROWS, CANDIDATES)
        torch.testing.assert_close(exported, values, rtol=1e-5, atol=1e-5)


def _candidates(eval_path: str) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The eval rows' candidate slots (B, K) that hold a candidate, each candidate's labels
    by task (n,) (its action weight's bit 1, bit 2, its watch time) and its row's
    user_active_degree (n,)."""
    rows = pq.read_table(eval_path).to_pylist()
    mask = torch.zeros(len(rows), CANDIDATES, dtype=torch.bool)
    actions, watched, groups = [], [], []
    for i, row in enumerate(rows):
        weights = [int(v) for v in row["cand_seq__action_weight"].split("|")][:CANDIDATES]
        mask[i, :len(weights)] = True
        actions += weights
        watched += [float(v) for v in row["cand_seq__watch_time"].split("|")][:CANDIDATES]
        groups += [row["user_active_degree"]] * len(weights)
    actions = torch.tensor(actions)
    labels = {"is_click": (actions & 1 > 0).double(), "is_like": (actions & 2 > 0).double(),
              "watchtime": torch.tensor(watched, dtype=torch.float64)}
    return mask, labels, torch.tensor(groups)


def _auc(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Every (positive, negative) pair's order: 1, 1/2 for a tie."""
    pos, neg = probs[labels > 0.5], probs[labels < 0.5]
    pairs = pos.unsqueeze(1) - neg.unsqueeze(0)
    return float((pairs > 0).double().mean() + 0.5 * (pairs == 0).double().mean())


def _xauc(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of all pairs that the predictions order as the labels."""
    agree = ((labels.unsqueeze(1) - labels) * (preds.unsqueeze(1) - preds)) > 0
    n = preds.numel()
    return float(torch.triu(agree, diagonal=1).sum() / (n * (n - 1) / 2))


def _grouped(metric, preds: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor,
             both_classes: bool) -> float:
    """The groups' mean of ``metric``: grouped_auc's over the groups holding both classes,
    grouped_xauc's weighted by the groups' candidates."""
    values, sizes = [], []
    for group in groups.unique():
        own = groups == group
        if both_classes and len((labels[own] > 0.5).unique()) < 2:
            continue
        values.append(metric(preds[own], labels[own]))
        sizes.append(1.0 if both_classes else float(own.sum()))
    return sum(v * s for v, s in zip(values, sizes)) / sum(sizes)


def test_the_evaluation_counts_each_candidate_once_over_the_ranks(two_ranks, restored):
    root, _, _ = two_ranks
    _, _, ranks = restored
    result, outputs = ranks[0]["result"], ranks[0]["outputs"]
    assert ranks[1]["result"] == result  # every rank's metrics over both ranks' candidates
    mask, labels, groups = _candidates(str(root / "data" / "eval"))
    assert int(mask.sum()) == labels["is_click"].numel()
    # every real candidate of every row once, its slot's output
    probs = {task: outputs[f"probs_{task}"][mask].double() for task in ("is_click", "is_like")}
    watch = outputs["y_watchtime"][mask].double()
    for task, p in probs.items():
        auc = BinnedAUC()
        auc.update(p, labels[task])
        assert result[f"auc_{task}"] == pytest.approx(auc.compute(), abs=1e-6), task
        logits = outputs[f"logits_{task}"][mask].double()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[task])
        assert result[f"binary_cross_entropy_{task}"] == pytest.approx(float(loss), rel=1e-5)
    assert result["mean_absolute_error_watchtime"] == pytest.approx(
        float((watch - labels["watchtime"]).abs().mean()), rel=1e-5)
    assert result["grouped_auc_is_click"] == pytest.approx(
        _grouped(_auc, probs["is_click"], labels["is_click"], groups, True), abs=1e-5)
    assert result["xauc_watchtime"] == pytest.approx(_xauc(watch, labels["watchtime"]),
                                                     abs=1e-5)
    assert result["grouped_xauc_watchtime"] == pytest.approx(
        _grouped(_xauc, watch, labels["watchtime"], groups, False), abs=1e-5)

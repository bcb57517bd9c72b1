"""Every model's dense network as the CUDA graphs run it: inputs of shapes fixed by the
batch size, no operator whose result the host reads, the same logits as the forward."""

from __future__ import annotations

import pytest
import test_dat
import test_dbmtl
import test_dc2vr
import test_dcn
import test_deepfm
import test_dlrm
import test_group_encoders
import test_hstu_match
import test_mask_net
import test_match_backbone
import test_mind
import test_mmoe
import test_multi_tower
import test_pepnet
import test_ple
import test_rocket_launching
import test_simple_multi_task
import test_wide_and_deep
import test_wukong
import test_xdeepfm
import torch
from host_reads import HostReads
from model_fakes import MODEL_CONFIG, fake_model, make_batch

from hashrec.features.batch import Batch
from hashrec.modules import DINAttention

# DSSM over the fakes: the user tower reads a dense feature, the item tower two tables.
DSSM = """
feature_groups { group_name: "user" feature_names: ["user_id", "price"] group_type: DEEP }
feature_groups { group_name: "item" feature_names: ["item_id", "cate_id"] group_type: DEEP }
dssm { user_tower { input: "user" mlp { hidden_units: [8] } }
       item_tower { input: "item" mlp { hidden_units: [6] } }
       output_dim: 4 similarity: COSINE temperature: 0.5 %s }
losses { softmax_cross_entropy {} }
"""

KINDS = {
    "multi_tower": (test_multi_tower.CONFIG, ()),
    "multi_tower_din": (MODEL_CONFIG, ()),
    "wide_and_deep": (test_wide_and_deep.CONFIG, test_wide_and_deep.WIDE),
    "deepfm": (test_deepfm.FM_GROUP, test_deepfm.WIDE),
    "deepfm-no-fm-group": (test_deepfm.CONFIG, test_deepfm.WIDE),
    "dlrm": (test_dlrm.CONFIG, ()),
    "dlrm-sparse-only": (test_dlrm.SPARSE_ONLY, ()),
    "mmoe": (test_mmoe.CONFIG, ()),
    "dbmtl": (test_dbmtl.CONFIG, ()),
    "dbmtl-experts": (test_dbmtl.EXPERTS, ()),
    "dbmtl-mask-net": (test_dbmtl.MASK_NET, ()),
    "dbmtl-mask-net-serial": (test_dbmtl.MASK_NET_SERIAL, ()),
    "dc2vr": (test_dc2vr.CONFIG, ()),
    "dc2vr-experts": (test_dc2vr.EXPERTS, ()),
    "ple": (test_ple.CONFIG, ()),
    "ple-no-shared": (test_ple.NO_SHARED, ()),
    "dcn_v1": (test_dcn.V1, ()),
    "dcn_v2": (test_dcn.V2, ()),
    "dcn_v2-cross-only": (test_dcn.V2_BARE, ()),
    "mask_net": (test_mask_net.CONFIG, ()),
    "mask_net-serial": (test_mask_net.SERIAL, ()),
    "xdeepfm": (test_xdeepfm.CONFIG, test_xdeepfm.WIDE),
    "simple_multi_task": (test_simple_multi_task.CONFIG, ()),
    "wukong": (test_wukong.CONFIG, ()),
    "wukong-sparse-only": (test_wukong.SPARSE_ONLY, ()),
    "multi_tower-sequence-encoders": (test_group_encoders.MULTI_TOWER, ()),
    "mmoe-sequence-encoders": (test_group_encoders.MMOE, ()),
    "multi_tower-hstu-encoder": (test_group_encoders.HSTU, ()),
    "pepnet": (test_pepnet.DEFAULT_NAMES, ()),  # no dropout: the forward repeats
    "pepnet-main-only": (test_pepnet.MAIN_ONLY, ()),
    "pepnet-domains": (test_pepnet.DOMAINS.replace("ppnet_dropout_ratio: [0.1]", ""), ()),
    "rocket_launching": (test_rocket_launching.CONFIG, ()),
    "rocket_launching-euclid": (test_rocket_launching.EUCLID, ()),
    "dssm-in-batch": (DSSM % "in_batch_negative: true", ()),
    "dssm-sampled": (DSSM % "", ()),
    "mind-in-batch": (test_mind.CONFIG % "in_batch_negative: true", ()),
    "mind-sampled": (test_mind.CONFIG % "", ()),
    "dat-in-batch": (test_dat.CONFIG % "in_batch_negative: true", ()),
    "dat-sampled": (test_dat.CONFIG % "", ()),
    "match_backbone-in-batch": (test_match_backbone.CONFIG % "in_batch_negative: true", ()),
    "match_backbone-sampled": (test_match_backbone.CONFIG % "", ()),
    "dssm-hard": (DSSM % "", ()),
    "dssm-in-batch-hard": (DSSM % "in_batch_negative: true", ()),
    "mind-hard": (test_mind.CONFIG % "", ()),
    "dat-hard": (test_dat.CONFIG % "", ()),
    "match_backbone-hard": (test_match_backbone.CONFIG % "", ()),
    "hstu_match-sampled": (test_hstu_match.CONFIG % "", ()),
    "hstu_match-deep-candidate": (test_hstu_match.DEEP_CANDIDATE % "", ()),
    "hstu_match-hard": (test_hstu_match.CONFIG % "", ()),
}
# Sampled negatives: the batch's 6 rows, then 3 sampled items' rows.
NEGATIVES = {"dssm-sampled": 3, "mind-sampled": 3, "dat-sampled": 3,
             "match_backbone-sampled": 3, "hstu_match-sampled": 3,
             "hstu_match-deep-candidate": 3}
# Hard negatives: 3 shared negatives, then 2 slots a row (hard_negative_sampler), some
# empty (the mask differs between the seeds: the shapes do not).
HARD = {kind: 2 for kind in KINDS if kind.endswith("-hard")}


def _batch(kind: str, seed: int) -> Batch:
    slots = HARD.get(kind, 0)
    negatives = 3 + 6 * slots if slots else NEGATIVES.get(kind, 0)
    batch = make_batch(6 + negatives, seed=seed)
    if not negatives:
        return batch
    labels = {name: label[:6] for name, label in batch.labels.items()}
    hard = None
    if slots:
        hard = torch.rand(6, slots, generator=torch.Generator().manual_seed(seed)) < 0.5
    return Batch(batch.sparse, dense=batch.dense, labels=labels, batch_size=6,
                 negatives=negatives, hard_negatives=hard)
# The label fields of the models that read more than ``clk``.
LABELS = {"mmoe": test_mmoe.LABELS, "dbmtl": test_dbmtl.LABELS,
          "dbmtl-experts": test_dbmtl.LABELS, "dbmtl-mask-net": test_dbmtl.LABELS,
          "dbmtl-mask-net-serial": test_dbmtl.LABELS, "dc2vr": test_dc2vr.LABELS,
          "dc2vr-experts": test_dc2vr.LABELS, "ple": test_ple.LABELS,
          "ple-no-shared": test_ple.LABELS, "simple_multi_task": test_simple_multi_task.LABELS,
          "pepnet": test_pepnet.LABELS, "pepnet-main-only": test_pepnet.LABELS,
          "pepnet-domains": test_pepnet.DOMAIN_LABELS}


def check_forward_logits(model, batch, logits) -> None:
    """The dense network's ``logits`` give each task the logits of the forward (read
    through ``predictions``: a RocketLaunching's train-mode output holds more; a PEPNet's
    towers per domain give every domain's)."""
    out = model(batch)
    from_dense = model.predictions(logits)
    for task in model.output_tasks:
        torch.testing.assert_close(from_dense[task.logits], out[task.logits])


@pytest.mark.parametrize("kind", list(KINDS))
def test_dense_network_reads_nothing_on_the_host(kind):
    text, wide = KINDS[kind]
    model = fake_model(text, wide, LABELS.get(kind, ("clk",)))
    for module in model.modules():  # as on CUDA: off it, DIN scores the valid positions
        if isinstance(module, DINAttention):
            module.packs = False
    shapes = []
    for seed in (1, 2):
        batch = _batch(kind, seed)
        inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
        shapes.append([tuple(x.shape) for x in inputs])
        with HostReads() as reads:
            logits = model.dense_from_inputs(*inputs)
            logits.sum().backward()
        assert dict(reads.counts) == {}
        check_forward_logits(model, batch, logits)
    assert shapes[0] == shapes[1]


def test_hstu_match_with_actions_and_time_reads_nothing_on_the_host():
    # its history's actions and timestamps (raw sub-features of the fakes' sequence), a
    # parameterized action MLP, time buckets and the timestamps' period features
    model = test_hstu_match._model(test_hstu_match.WITH_TIME % "")
    shapes = []
    for seed in (1, 2):
        batch = test_hstu_match._batch(seed=seed)
        inputs = model.dense_inputs(model.embedding(batch.sparse), batch)
        shapes.append([tuple(x.shape) for x in inputs])
        with HostReads() as reads:
            logits = model.dense_from_inputs(*inputs)
            logits.sum().backward()
        assert dict(reads.counts) == {}
        model.eval()  # without the contextual features' dropout: the forward's logits
        torch.testing.assert_close(model.dense_from_inputs(*inputs),
                                   model(batch)["similarity"])
        model.train()
    assert shapes[0] == shapes[1]

"""Model registry: the ``model_config`` oneof name -> model class."""

from __future__ import annotations

from hashrec.models.dat import DAT
from hashrec.models.dbmtl import DBMTL
from hashrec.models.dc2vr import DC2VR
from hashrec.models.dcn import DCNV1, DCNV2
from hashrec.models.deepfm import DeepFM
from hashrec.models.dlrm import DLRM
from hashrec.models.dlrm_hstu import DlrmHSTU
from hashrec.models.dssm import DSSM
from hashrec.models.errors import ModelError
from hashrec.models.hstu_match import HSTUMatch
from hashrec.models.mask_net import MaskNet
from hashrec.models.match_backbone import MatchBackbone
from hashrec.models.mind import MIND
from hashrec.models.mmoe import MMoE
from hashrec.models.multi_tower import MultiTower
from hashrec.models.multi_tower_din import MultiTowerDIN
from hashrec.models.pepnet import PEPNet
from hashrec.models.ple import PLE
from hashrec.models.rank_backbone import MultiTaskBackbone, RankBackbone
from hashrec.models.rank_model import RankModel
from hashrec.models.rocket_launching import RocketLaunching
from hashrec.models.simple_multi_task import SimpleMultiTask
from hashrec.models.tdm import TDM
from hashrec.models.wide_and_deep import WideAndDeep
from hashrec.models.wukong import WuKong
from hashrec.models.xdeepfm import XDeepFM

MODELS: dict[str, type[RankModel]] = {
    "dat": DAT,
    "dbmtl": DBMTL,
    "dc2vr": DC2VR,
    "dcn_v1": DCNV1,
    "dcn_v2": DCNV2,
    "deepfm": DeepFM,
    "dlrm": DLRM,
    "dlrm_hstu": DlrmHSTU,
    "dssm": DSSM,
    "dssm_v2": DSSM,
    "hstu_match": HSTUMatch,
    "mask_net": MaskNet,
    "match_backbone": MatchBackbone,
    "mind": MIND,
    "mmoe": MMoE,
    "multi_task_backbone": MultiTaskBackbone,
    "multi_tower": MultiTower,
    "multi_tower_din": MultiTowerDIN,
    "pepnet": PEPNet,
    "ple": PLE,
    "rank_backbone": RankBackbone,
    "rocket_launching": RocketLaunching,
    "simple_multi_task": SimpleMultiTask,
    "tdm": TDM,
    "wide_and_deep": WideAndDeep,
    "wukong": WuKong,
    "xdeepfm": XDeepFM,
}


def create_model(model_config, feature_set, sparse_optimizer, device=None,
                 embedding=None) -> RankModel:
    """Build the model the config's ``model`` oneof names.

    Args as ``RankModel`` (``embedding``: optional prebuilt embedding module).

    Raises:
        ModelError: no model set, or a model kind HashRec does not implement.
    """
    kind = model_config.WhichOneof("model")
    if kind is None:
        raise ModelError(f"model_config sets no model; allowed: {', '.join(MODELS)}")
    if kind not in MODELS:
        raise ModelError(
            f"model_config.{kind} is not supported yet; allowed: {', '.join(MODELS)}")
    return MODELS[kind](model_config, feature_set, sparse_optimizer, device, embedding)

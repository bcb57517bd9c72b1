"""Ranking models built from a pipeline config (MultiTower, MultiTowerDIN, WideAndDeep,
DeepFM, DLRM, DCN v1 and v2, MaskNet, xDeepFM, WuKong, RocketLaunching, RankBackbone,
TDM), multi-task ones (SimpleMultiTask, MMoE, DBMTL, DC2VR, PLE, PEPNet, MultiTaskBackbone) and
the match models DSSM, DAT, MIND, MatchBackbone and HSTUMatch (``MatchModel`` their
base), and the generative ranking model DlrmHSTU."""

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
from hashrec.models.match_model import MatchModel
from hashrec.models.mind import MIND
from hashrec.models.mmoe import MMoE
from hashrec.models.multi_tower import MultiTower
from hashrec.models.multi_tower_din import MultiTowerDIN
from hashrec.models.pepnet import PEPNet
from hashrec.models.ple import PLE
from hashrec.models.rank_backbone import MultiTaskBackbone, RankBackbone
from hashrec.models.rank_model import RankModel
from hashrec.models.registry import MODELS, create_model
from hashrec.models.rocket_launching import RocketLaunching
from hashrec.models.simple_multi_task import SimpleMultiTask
from hashrec.models.tdm import TDM
from hashrec.models.wide_and_deep import WideAndDeep
from hashrec.models.wukong import WuKong
from hashrec.models.xdeepfm import XDeepFM

__all__ = ["DAT", "DBMTL", "DC2VR", "DCNV1", "DCNV2", "DLRM", "DSSM", "DeepFM", "DlrmHSTU",
           "HSTUMatch",
           "MIND", "MMoE",
           "MaskNet",
           "MatchBackbone", "MatchModel", "ModelError",
           "MultiTaskBackbone", "MultiTower", "MultiTowerDIN", "PEPNet", "PLE", "RankBackbone",
           "RankModel", "MODELS", "RocketLaunching", "SimpleMultiTask", "TDM",
           "WideAndDeep", "WuKong", "XDeepFM", "create_model"]

"""Training losses, by registered name. Adding a loss: one file here, a config dataclass whose fields declare their
defaults and rules once (``checked_field``) and an ``nn.Module`` that takes them by name, registered with one
:func:`register_loss` call: every module of this package that does not start with ``_`` is imported below.

Every loss is called as ``loss(logits, targets, features)`` and returns a scalar; ``reduction``
"mean" gives the batch-mean form and "sum" batch size × that (see :mod:`calib.losses._reduction`).
"""

from calib._registry import import_submodules
from calib.losses import (
    acls,
    adafocal,
    cpc,
    crl,
    cross_entropy,
    dual_focal,
    ecp,
    fedlas,
    flsd,
    focal,
    label_smoothing,
    mbls,
    mdca,
    mmce,
)
from calib.losses._base import ConfiguredLoss, LossSpec, Reduction, TrainingStateLoss, build_loss, register_loss
from calib.losses._registry import LOSSES
from calib.losses.acls import ACLS, ACLSConfig
from calib.losses.adafocal import AdaFocal, AdaFocalConfig
from calib.losses.cpc import CPC, CPCConfig
from calib.losses.crl import CRL, CRLConfig
from calib.losses.cross_entropy import CrossEntropy, CrossEntropyConfig
from calib.losses.dual_focal import DualFocalLoss, DualFocalLossConfig
from calib.losses.ecp import ECP, ECPConfig
from calib.losses.fedlas import FeDLaSLS, FeDLaSLSConfig, FeDLaSMbLS, FeDLaSMbLSConfig
from calib.losses.flsd import FLSD53, FLSD53Config
from calib.losses.focal import FocalLoss, FocalLossConfig
from calib.losses.label_smoothing import LabelSmoothing, LabelSmoothingConfig
from calib.losses.mbls import MbLS, MbLSConfig
from calib.losses.mdca import MDCA, MDCAConfig
from calib.losses.mmce import MMCE, MMCEConfig

import_submodules(__name__, __path__)

__all__ = [
    "ACLS",
    "CPC",
    "CRL",
    "ECP",
    "FLSD53",
    "LOSSES",
    "MDCA",
    "MMCE",
    "ACLSConfig",
    "AdaFocal",
    "AdaFocalConfig",
    "CPCConfig",
    "CRLConfig",
    "ConfiguredLoss",
    "CrossEntropy",
    "CrossEntropyConfig",
    "DualFocalLoss",
    "DualFocalLossConfig",
    "ECPConfig",
    "FLSD53Config",
    "FeDLaSLS",
    "FeDLaSLSConfig",
    "FeDLaSMbLS",
    "FeDLaSMbLSConfig",
    "FocalLoss",
    "FocalLossConfig",
    "LabelSmoothing",
    "LabelSmoothingConfig",
    "LossSpec",
    "MDCAConfig",
    "MMCEConfig",
    "MbLS",
    "MbLSConfig",
    "Reduction",
    "TrainingStateLoss",
    "acls",
    "adafocal",
    "build_loss",
    "cpc",
    "crl",
    "cross_entropy",
    "dual_focal",
    "ecp",
    "fedlas",
    "flsd",
    "focal",
    "label_smoothing",
    "mbls",
    "mdca",
    "mmce",
    "register_loss",
]

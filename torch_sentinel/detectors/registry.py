"""The detectors that ship, in ladder order. Add a detector here to switch it on by default."""

from __future__ import annotations

from .amp_skips import AmpSkipsDetector
from .base import Detector
from .dead_relu import DeadReluDetector
from .diverging import DivergingDetector
from .eval_mode_training import EvalModeTrainingDetector
from .gradient_scale import ExplodingGradientDetector, VanishingGradientDetector
from .loss_broadcast import LossBroadcastDetector
from .loss_spike import LossSpikeDetector
from .missing_zero_grad import MissingZeroGradDetector
from .no_gradient import NoGradientDetector
from .no_update import NoUpdateDetector
from .overfitting import OverfittingDetector
from .plateau import PlateauDetector
from .probabilities_as_logits import ProbabilitiesAsLogitsDetector
from .saturation import SaturationDetector
from .unnormalized_input import UnnormalizedInputDetector
from .unregistered_parameter import UnregisteredParameterDetector
from .update_ratio import UpdateRatioDetector

DETECTORS: list[type[Detector]] = [
    # data
    UnnormalizedInputDetector,
    # shapes
    LossBroadcastDetector,
    # forward
    DeadReluDetector,
    EvalModeTrainingDetector,
    SaturationDetector,
    # loss
    ProbabilitiesAsLogitsDetector,
    # gradients
    NoGradientDetector,
    MissingZeroGradDetector,
    ExplodingGradientDetector,
    VanishingGradientDetector,
    AmpSkipsDetector,
    # updates
    NoUpdateDetector,
    UnregisteredParameterDetector,
    UpdateRatioDetector,
    # curves
    OverfittingDetector,
    DivergingDetector,
    PlateauDetector,
    LossSpikeDetector,
]

"""The built-in probes: each owns some ledger slots and fills them from the collector's events.

=================  =================================================  ==========================
module             slots (ledger blocks)                              events
=================  =================================================  ==========================
``data``           ``data.min/max`` (inputs, aux)                     on_data
``forward``        ``act.min/max`` (one pair per module)              on_output
``outgrad``        ``outgrad.min/max`` (one pair per module)          on_output_grad
``loss``           ``loss`` (auto, explicit, validation)              on_backward
``norms``          ``grad_norm``, ``param_norm``, ``misc`` (stale)    on_backward, on_pre_step
``updates``        ``update_norm``                                    on_pre_step, on_post_step
``amp``            ``misc.amp_scale``; unscaled loss, skipped steps   on_post_step (+ GradScaler)
``steps``          host meta: learning rates                          on_post_step
``clip``           ``clip_coef`` (one per parameter)                  clip_grad_norm_ (patched)
=================  =================================================  ==========================
"""

from .amp import AmpProbe
from .clip import ClipProbe
from .data import DataProbe
from .forward import ForwardProbe
from .loss import LossProbe
from .norms import NormsProbe
from .outgrad import OutputGradProbe
from .steps import StepProbe
from .updates import UpdateProbe

__all__ = ["AmpProbe", "ClipProbe", "DataProbe", "ForwardProbe", "LossProbe", "NormsProbe", "OutputGradProbe", "StepProbe", "UpdateProbe"]

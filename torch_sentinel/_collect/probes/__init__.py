"""The built-in probes: each owns some ledger slots and fills them from the collector's events.

=================  =================================================  ==========================
module             slots (ledger blocks)                              events
=================  =================================================  ==========================
``data``           ``data.min/max`` (inputs, aux)                     on_data
``forward``        ``act.min/max`` (one pair per module)              on_output
``outgrad``        ``outgrad.min/max`` (one pair per module)          on_output_grad
``norms``          ``grad_norm``, ``param_norm``, ``misc`` (stale)    on_backward, on_cleared, on_pre_step
``updates``        ``update_norm``                                    on_pre_step, on_post_step
``steps``          host meta: learning rates                          on_post_step
``clip``           ``clip_coef`` (one per parameter)                  clip_grad_norm_ (patched)
=================  =================================================  ==========================

The step's loss (``loss_tally.py``) and the GradScaler's part (``amp.py``) are not probes: the
collector's event sources call them in their order, since the rest of the step depends on them.
"""

from .clip import ClipProbe
from .data import DataProbe
from .forward import ForwardProbe
from .norms import NormsProbe
from .outgrad import OutputGradProbe
from .steps import StepProbe
from .updates import UpdateProbe

__all__ = ["ClipProbe", "DataProbe", "ForwardProbe", "NormsProbe", "OutputGradProbe", "StepProbe", "UpdateProbe"]

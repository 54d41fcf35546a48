"""The evidence ladder: which rung fails first, and what to check next in the seeds' vocabulary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from .._findings import BOUNDARIES, Finding

__all__ = ["HEALTHY_NEXT_CHECK", "HYPOTHESES", "NEXT_CHECKS", "first_failing_boundary", "next_check_for"]

HEALTHY_NEXT_CHECK = "continue_training_or_collect_more_evidence"

#: The next action when a boundary fails, by finding kind; kinds not listed fall back to the
#: boundary's generic check.
NEXT_CHECKS: dict[str, str] = {
    "non_finite": "inspect_first_nonfinite_module",
    "shape_mismatch": "name_the_axes_and_fix_the_layer_contract",
    "loss_broadcast": "reshape_target_or_output_to_match",
    "unnormalized_input": "normalize_inputs",
    "dead_relu": "inspect_initialization_and_learning_rate",
    "eval_mode_training": "call_model_train_before_training",
    "probabilities_as_logits": "feed_logits_to_the_loss",
    "no_gradient": "inspect_graph_connectivity",
    "missing_zero_grad": "clear_gradients_every_step",
    "exploding_gradient": "lower_learning_rate_or_clip_gradients",
    "vanishing_gradient": "inspect_initialization_and_activations",
    "no_update": "inspect_optimizer_update",
    "unregistered_parameter": "register_parameters_with_optimizer",
    "overfitting": "investigate_generalization",
    "diverging": "lower_learning_rate",
    "plateau": "inspect_learning_rate_and_capacity",
    "loss_spike": "inspect_the_first_mover",
    "amp_skips": "inspect_backward_path",
    "update_ratio": "inspect_learning_rate",
    "saturation": "inspect_initialization_and_input_scale",
}

BOUNDARY_CHECKS: dict[str, str] = {
    "data": "inspect_data_and_targets",
    "shapes": "name_the_axes_and_fix_the_layer_contract",
    "forward": "inspect_forward_values",
    "loss": "inspect_loss_definition",
    "gradients": "inspect_backward_path",
    "updates": "inspect_optimizer_update",
    "curves": "investigate_generalization",
}

#: A one-line hypothesis per kind, for the experiment-log style report.
HYPOTHESES: dict[str, str] = {
    "non_finite": "a NaN/Inf starts at this boundary and propagates downstream",
    "shape_mismatch": "the data/layer contract does not represent the intended operation",
    "loss_broadcast": "the loss silently broadcasts mismatched shapes",
    "unnormalized_input": "inputs are not scaled to the range the initialisation assumes",
    "dead_relu": "units stopped firing (too high a learning rate, or a bad bias/initialisation)",
    "eval_mode_training": "model.eval() was left on while training",
    "probabilities_as_logits": "the loss applies softmax/sigmoid a second time",
    "no_gradient": "the graph is cut (detach, numpy round trip) or a branch is unused",
    "missing_zero_grad": "gradients accumulate across steps because they are never cleared",
    "exploding_gradient": "gradients grow through depth or time",
    "vanishing_gradient": "gradients shrink through depth (saturation, poor initialisation)",
    "no_update": "the optimizer does not move these parameters",
    "unregistered_parameter": "trainable tensors are missing from every optimizer param group",
    "overfitting": "the model fits training noise",
    "diverging": "the optimization is unstable",
    "plateau": "learning has stalled",
    "loss_spike": "one module left its recent behaviour before the loss jumped; the evidence names how",
    "amp_skips": "gradients are non-finite at every step, so the scaler never applies an update",
    "update_ratio": "the learning rate is out of scale with the weights",
    "saturation": "pre-activations are too large (initialisation or input scale), so units sit on flat ends",
}


def _rank(boundary: str) -> int:
    return BOUNDARIES.index(boundary)


def first_failing_boundary(findings: Iterable[Finding]) -> Optional[str]:
    faults = [f for f in findings if f.is_fault]
    if not faults:
        return None
    return min((f.boundary for f in faults), key=_rank)


def next_check_for(findings: Iterable[Finding]) -> str:
    """The next check for the first failing rung: the most severe, earliest finding there."""
    faults = sorted((f for f in findings if f.is_fault), key=sort_key)
    if not faults:
        return HEALTHY_NEXT_CHECK
    first = faults[0]
    return first.next_check or NEXT_CHECKS.get(first.kind) or BOUNDARY_CHECKS[first.boundary]


def sort_key(f: Finding) -> tuple[int, int, int, str]:
    severity = {"error": 0, "warning": 1, "info": 2}[f.severity]
    return (_rank(f.boundary), severity, f.step if f.step is not None else 1 << 60, f.kind)

"""The words of a loss-contract verdict: the loss, the clause, the figures, the call site, the fix."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .calls import LossCall

__all__ = ["explain"]


def _g(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:.3g}"


def _pct(v: Optional[float]) -> str:
    return "?" if v is None else f"{100 * v:.0f}%"


def _source(call: LossCall) -> str:
    if call.module is not None and call.producer in ("softmax", "log_softmax", "sigmoid") and call.module:
        return f"the output of {call.module}"
    if call.producer == "linear":
        return "the input (a Linear's output)"
    if call.module is not None and call.producer in ("softmax", "log_softmax", "sigmoid"):
        return f"the input (a {call.producer} in the forward of {call.module or '<model>'})"
    if call.producer:
        return f"the input (a {call.producer} output)"
    return "the input"


def _probabilities_as_logits(call: LossCall, f: dict[str, Any]) -> str:
    wants = "log-probabilities" if call.loss == "nll_loss" else "logits"
    if call.loss == "binary_cross_entropy_with_logits":
        what = f"values all in [0, 1] (from {_g(f.get('min'))} to {_g(f.get('max'))})"
    else:
        what = f"non-negative rows summing to 1 over dim {call.class_dim} (max |sum - 1| = {_g(f.get('max_rowsum_deviation'))})"
    return f"{call.loss} expects {wants} but was given probabilities: {_source(call)} had {what}"


def _log_probabilities(call: LossCall, f: dict[str, Any]) -> str:
    dim = call.class_dim if call.class_dim is not None else call.target_dim
    rows = f"rows log-sum-exp to {_g(f.get('lse_min'))}..{_g(f.get('lse_max'))} ({_pct(f.get('rows_off'))} of rows off 0)"
    if call.loss == "kl_div":
        return (f"kl_div expects log-probabilities as its input, but it was given values from {_g(f.get('min'))} "
                f"to {_g(f.get('max'))} (a log-probability is <= 0) whose {rows} over dim {dim}: pass "
                "log_softmax(...) as the input, not probabilities or scores")
    return (f"{call.loss} expects log-probabilities over dim {dim}, but its input's {rows}, expected 0 for "
            f"log-probabilities over dim {dim}: {_source(call)} looks like raw scores; apply "
            f"log_softmax(dim={dim}) first" + (", or use cross_entropy" if call.loss == "nll_loss" else ""))


def _class_dim(call: LossCall, f: dict[str, Any]) -> str:
    shape = tuple(call.input_shape)
    if f.get("normalised_dim") is not None:
        return (f"{call.loss} reads the classes at dim {call.class_dim} of its input {shape}, but the input is a "
                f"{call.producer} over dim {f['normalised_dim']}: the classes are at dim {f['normalised_dim']}. "
                f"Move them to dim {call.class_dim} (x.movedim({f['normalised_dim']}, {call.class_dim})) or "
                "flatten to (N*L, C)")
    return (f"{call.loss} reads dim {call.class_dim} of its input {shape} as the classes, but the input comes "
            f"straight from a Linear over its last dim ({shape[-1]} outputs); torch accepts it because dim "
            f"{call.class_dim} and the last dim have the same size. If the last dim holds the classes, pass "
            f"x.transpose(1, -1) or flatten to (N*L, C)")


def _log_input(call: LossCall, f: dict[str, Any]) -> str:
    if f.get("log_input"):
        return (f"poisson_nll_loss with log_input=True reads its input as log-rates, but the input is a "
                f"{call.producer} output, never negative (min {_g(f.get('min'))}): pass log_input=False for "
                "rates, or feed the log-rate")
    return (f"poisson_nll_loss with log_input=False reads its input as rates, but it holds negative values "
            f"(min {_g(f.get('min'))}): pass log_input=True for log-rates, or make the rate non-negative")


def _broadcast(call: LossCall, f: dict[str, Any]) -> str:
    return (f"{call.loss} got input of shape {tuple(call.input_shape)} and target of shape "
            f"{tuple(call.target_shape or ())}; they broadcast to {tuple(call.broadcast_shape or ())}, so every "
            "prediction is compared with targets of other samples")


def _target_range(call: LossCall, f: dict[str, Any]) -> str:
    lo, hi = f.get("target_min"), f.get("target_max")
    hint = ""
    if hi is not None and hi > 1.5:
        hint = f": a {hi:.0f}-scale label (an image mask stored 0-255?) needs dividing by its maximum"
    elif lo is not None and lo < -0.5:
        hint = ": {-1, 1} labels map to {0, 1} with (t + 1) / 2"
    return f"{call.loss} expects targets in [0, 1], but they range from {_g(lo)} to {_g(hi)}{hint}"


def _target_signs(call: LossCall, f: dict[str, Any]) -> str:
    return (f"{call.loss} expects targets in {{-1, 1}}, but {_pct(f.get('targets_not_pm1'))} of them are "
            "neither: {0, 1} labels make the 0s contribute a constant (or nothing); map them with 2 * t - 1")


def _target_probabilities(call: LossCall, f: dict[str, Any]) -> str:
    lo, hi, off = _g(f.get("target_min")), _g(f.get("target_max")), _pct(f.get("rows_off"))
    dim = call.target_dim
    if call.loss == "kl_div" and call.option("log_target", False):
        return (f"kl_div with log_target=True expects log-probability targets (<= 0, rows log-sum-exp to 0 over "
                f"dim {dim}), but they range from {lo} to {hi} with {off} of rows off")
    if call.loss == "kl_div":
        return (f"kl_div expects probability targets (rows in [0, 1] summing to 1 over dim {dim}; pass "
                f"log_target=True for log-probabilities), but they range from {lo} to {hi} and {off} of rows "
                "do not sum to 1")
    return (f"cross_entropy was given class-probability targets (floating, of the input's shape) that are not "
            f"distributions over dim {dim}: values from {lo} to {hi}, {off} of rows summing to neither 1 nor 0. "
            "Multi-hot labels belong to binary_cross_entropy_with_logits; a teacher's logits need a softmax first")


def _target_indices(call: LossCall, f: dict[str, Any]) -> str:
    return (f"multilabel_margin_loss expects each target row to list the positive class indices once, then -1, "
            f"but {_pct(f.get('rows_repeating_a_class'))} of rows list a class twice: a multi-hot mask read as "
            "indices? Use multilabel_soft_margin_loss for masks, or turn the mask into index lists")


def _target_not_blank(call: LossCall, f: dict[str, Any]) -> str:
    return (f"ctc_loss targets hold the blank ({f.get('blank')}) in {_pct(f.get('labels_blank'))} of the labels "
            "within their lengths; the blank can never be emitted as a label, so those targets are unreachable: "
            "number the symbols from 1 when blank=0, or pass the blank's index")


def _target_nonnegative(call: LossCall, f: dict[str, Any]) -> str:
    return f"poisson_nll_loss expects counts >= 0 as targets, but the smallest is {_g(f.get('target_min'))}"


_WORDS: dict[str, Callable[[LossCall, dict[str, Any]], str]] = {
    "probabilities_as_logits": _probabilities_as_logits,
    "log_probabilities": _log_probabilities,
    "class_dim": _class_dim,
    "log_input": _log_input,
    "loss_broadcast": _broadcast,
    "target_range": _target_range,
    "target_signs": _target_signs,
    "target_probabilities": _target_probabilities,
    "target_indices": _target_indices,
    "target_not_blank": _target_not_blank,
    "target_nonnegative": _target_nonnegative,
}


def explain(clause: str, call: LossCall, figures: dict[str, Any], broken: int, probes: int) -> str:
    """The finding's message: what the loss expects, what it got (the figures), how often, where."""
    text = _WORDS[clause](call, figures)
    if clause not in ("loss_broadcast",):
        text += f", on {broken} of {probes} probed steps"
    return f"{text} (at {call.site})"

"""The loss contracts: one declarative entry per loss in ``torch.nn`` / ``torch.nn.functional``.

Each entry says what the loss takes: the input's domain (logits, probabilities, or
log-probabilities over which dimension), the target's domain (class indices, probabilities in
[0, 1] that sum to 1, {0, 1} or {-1, 1} labels, ...), the class dimension, the reductions, the
shape and broadcast rule, and which *clauses* of that contract the sentinel checks. A clause
torch checks itself (class indices out of range raise on CPU and assert on CUDA; BCE targets
outside [0, 1] raise on CPU; a negative Gaussian variance raises) is named in ``torch_checks``
and not checked again.

``tests/losses/test_contracts.py`` enumerates ``torch.nn``'s losses and fails for any loss
without an entry here, so a loss added to torch cannot go unjudged.

The clauses, and the finding kind each is reported as (``CLAUSES``):

- ``probabilities_as_logits``: a loss that applies log-softmax/log-sigmoid itself (or expects
  log-probabilities) is given a distribution (kind ``probabilities_as_logits``, a stable name);
- ``log_probabilities``: rows of an input that should hold log-probabilities over the class
  dimension log-sum-exp to 0 (``nll_loss``, ``ctc_loss``, ``kl_div``'s input);
- ``class_dim``: the input is normalised over another dimension than the one the loss reads
  as classes (``log_softmax(x, -1)`` of an (N, L, C) tensor into ``nll_loss``), or is a Linear's
  (N, L, C) output read with the classes at dim 1;
- ``log_input``: ``poisson_nll_loss`` with ``log_input=True`` given a rate (an exp/softplus
  output), or with ``log_input=False`` given negative rates;
- ``loss_broadcast``: an element-wise loss whose target broadcasts to more elements than the
  input has, e.g. (B, 1) against (B,) (kind ``loss_broadcast``, a stable name);
- ``target_range``: targets in [0, 1]; ``target_signs``: targets in {-1, 1};
  ``target_probabilities``: class-probability targets (non-negative rows summing to 1; or
  log-probabilities with ``log_target``); ``target_indices``: ``multilabel_margin_loss`` index
  lists (classes listed once, padded with -1); ``target_not_blank``: CTC labels are never the
  blank; ``target_nonnegative``: Poisson counts are >= 0.

Why ``cross_entropy`` on ``log_softmax`` output is not a clause: log-softmax is idempotent
(log-probabilities already log-sum-exp to 0), so the loss and its gradient are exactly those of
``nll_loss(log_softmax(x))``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

__all__ = ["CLAUSES", "CONTRACTS", "Contract", "by_function", "by_module", "functional_names"]

#: Clause -> the finding kind it is reported as.
CLAUSES: dict[str, str] = {
    "probabilities_as_logits": "probabilities_as_logits",
    "log_probabilities": "invalid_loss_input",
    "class_dim": "invalid_loss_input",
    "log_input": "invalid_loss_input",
    "loss_broadcast": "loss_broadcast",
    "target_range": "invalid_target",
    "target_signs": "invalid_target",
    "target_probabilities": "invalid_target",
    "target_indices": "invalid_target",
    "target_not_blank": "invalid_target",
    "target_nonnegative": "invalid_target",
}

_MEAN_SUM_NONE = ("mean", "sum", "none")


@dataclasses.dataclass(frozen=True)
class Contract:
    """What one loss takes.

    Args:
        name: the functional name (``F.<name>``), or the module's name for a module-only loss.
        modules: the ``torch.nn`` modules that compute it (they call ``F.<name>``).
        functional: whether ``F.<name>`` exists; calls are observed there, which covers the
            modules too.
        inputs: the positional names of the tensors the checks read: the input first, then
            the target (and for CTC the lengths).
        input: the input's domain, in words.
        target: the target's domain, in words.
        class_dim: the dimension holding the classes: ``1`` (dim 0 for an unbatched input),
            ``-1`` (the last), or None (element-wise).
        reductions: the ``reduction`` values it accepts.
        shape: the shape and broadcast rule, in words.
        clauses: the clauses the sentinel checks (keys of :data:`CLAUSES`).
        torch_checks: what torch itself refuses, so it is not checked again.
    """

    name: str
    modules: tuple[str, ...]
    functional: bool
    inputs: tuple[str, ...]
    input: str
    target: str
    class_dim: Optional[int]
    reductions: tuple[str, ...]
    shape: str
    clauses: tuple[str, ...]
    torch_checks: str = ""

    def __post_init__(self) -> None:
        unknown = [c for c in self.clauses if c not in CLAUSES]
        if unknown:
            raise ValueError(f"{self.name}: unknown clauses {unknown}")


_ELEMENTWISE = "input and target of the same shape; a target that broadcasts to more elements than the input is a finding"

CONTRACTS: tuple[Contract, ...] = (
    Contract("cross_entropy", ("CrossEntropyLoss",), True, ("input", "target"),
             "logits (unnormalised scores) over the class dim",
             "class indices in [0, C) or ignore_index; or class probabilities of the input's shape (rows sum to 1)",
             1, _MEAN_SUM_NONE, "(N, C, d1, ...) or (C,); index target (N, d1, ...), probability target as input",
             ("probabilities_as_logits", "class_dim", "target_probabilities"),
             "class indices out of range (CPU raises, CUDA asserts); a float target of index shape"),
    Contract("nll_loss", ("NLLLoss",), True, ("input", "target"),
             "log-probabilities over the class dim (rows log-sum-exp to 0)",
             "class indices in [0, C) or ignore_index", 1, _MEAN_SUM_NONE,
             "(N, C, d1, ...) or (C,); target (N, d1, ...)",
             ("probabilities_as_logits", "log_probabilities", "class_dim"),
             "class indices out of range (CPU raises, CUDA asserts)"),
    Contract("binary_cross_entropy", ("BCELoss",), True, ("input", "target"),
             "probabilities in [0, 1]", "probabilities in [0, 1] (soft targets allowed)", None, _MEAN_SUM_NONE,
             "target of the input's shape", (),
             "input or target outside [0, 1] (CPU raises), a target of another size (raises)"),
    Contract("binary_cross_entropy_with_logits", ("BCEWithLogitsLoss",), True, ("input", "target"),
             "logits (any real)", "probabilities in [0, 1] (soft targets allowed)", None, _MEAN_SUM_NONE,
             "target of the input's shape; pos_weight broadcasts over the class dim",
             ("probabilities_as_logits", "target_range"), "a target of another size (raises)"),
    Contract("kl_div", ("KLDivLoss",), True, ("input", "target"),
             "log-probabilities over the distribution dim (the producer's, else the last)",
             "probabilities (rows sum to 1); log-probabilities with log_target=True", None,
             ("batchmean", "sum", "mean", "none"), _ELEMENTWISE,
             ("log_probabilities", "target_probabilities", "loss_broadcast"),
             "reduction='mean' warns (it divides by the number of elements)"),
    Contract("mse_loss", ("MSELoss",), True, ("input", "target"), "real", "real", None, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("loss_broadcast",), "a broadcast warns once"),
    Contract("l1_loss", ("L1Loss",), True, ("input", "target"), "real", "real", None, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("loss_broadcast",), "a broadcast warns once"),
    Contract("huber_loss", ("HuberLoss",), True, ("input", "target"), "real", "real", None, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("loss_broadcast",), "a broadcast warns once"),
    Contract("smooth_l1_loss", ("SmoothL1Loss",), True, ("input", "target"), "real", "real", None,
             _MEAN_SUM_NONE, _ELEMENTWISE, ("loss_broadcast",), "a broadcast warns once"),
    Contract("poisson_nll_loss", ("PoissonNLLLoss",), True, ("input", "target"),
             "log-rates (log_input=True) or rates >= 0 (log_input=False)", "counts >= 0", None, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("log_input", "target_nonnegative", "loss_broadcast")),
    Contract("gaussian_nll_loss", ("GaussianNLLLoss",), True, ("input", "target", "var"),
             "means (any real)", "real; var >= 0 of the input's shape, or one dim short, or one dim of size 1",
             None, _MEAN_SUM_NONE, _ELEMENTWISE, ("loss_broadcast",),
             "a negative variance raises; a variance of another size raises"),
    Contract("margin_ranking_loss", ("MarginRankingLoss",), True, ("input1", "input2", "target"),
             "scores (any real)", "{-1, 1}: which input should rank higher", None, _MEAN_SUM_NONE,
             "input1, input2, target of one shape", ("target_signs",), "tensors of different dims (raises)"),
    Contract("hinge_embedding_loss", ("HingeEmbeddingLoss",), True, ("input", "target"),
             "distances (>= 0 by convention)", "{-1, 1}: similar or dissimilar", None, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("target_signs", "loss_broadcast")),
    Contract("soft_margin_loss", ("SoftMarginLoss",), True, ("input", "target"), "scores (any real)", "{-1, 1}",
             None, _MEAN_SUM_NONE, "target of the input's shape", ("target_signs",), "a broadcast raises"),
    Contract("cosine_embedding_loss", ("CosineEmbeddingLoss",), True, ("input1", "input2", "target"),
             "embeddings (N, D)", "{-1, 1} per pair (N,)", None, _MEAN_SUM_NONE, "input1, input2 (N, D); target (N,)",
             ("target_signs",), "a target of another shape (raises)"),
    Contract("triplet_margin_loss", ("TripletMarginLoss",), True, ("anchor", "positive", "negative"),
             "embeddings (N, D) or (D,)", "none (positive and negative are the targets)", None, _MEAN_SUM_NONE,
             "anchor, positive, negative of one shape", (), "tensors of different dims (raises)"),
    Contract("triplet_margin_with_distance_loss", ("TripletMarginWithDistanceLoss",), True,
             ("anchor", "positive", "negative"), "embeddings for the distance function",
             "none (positive and negative are the targets)", None, _MEAN_SUM_NONE,
             "as the distance function accepts", (), "the distance function's own checks"),
    Contract("multi_margin_loss", ("MultiMarginLoss",), True, ("input", "target"),
             "scores (any real) over the class dim", "class indices in [0, C)", 1, _MEAN_SUM_NONE,
             "(N, C) or (C,); target (N,) or ()", (), "class indices out of range (raises)"),
    Contract("multilabel_margin_loss", ("MultiLabelMarginLoss",), True, ("input", "target"),
             "scores (any real) over the class dim",
             "index lists: each row the positive classes, once each, then -1 padding", 1, _MEAN_SUM_NONE,
             "target of the input's shape (N, C) or (C,)", ("target_indices",),
             "indices out of range (raises), a target of another shape (raises)"),
    Contract("multilabel_soft_margin_loss", ("MultiLabelSoftMarginLoss",), True, ("input", "target"),
             "logits (any real) per class", "multi-hot {0, 1} (or probabilities in [0, 1])", 1, _MEAN_SUM_NONE,
             _ELEMENTWISE, ("target_range", "loss_broadcast")),
    Contract("ctc_loss", ("CTCLoss",), True, ("log_probs", "targets", "input_lengths", "target_lengths"),
             "log-probabilities over the last dim (T, N, C) or (T, C)",
             "labels in [0, C) other than blank, padded (N, S) or concatenated", -1, _MEAN_SUM_NONE,
             "input_lengths (N,) <= T, target_lengths (N,) <= S", ("log_probabilities", "target_not_blank"),
             "lengths of the wrong size or beyond T/S (raises)"),
    Contract("linear_cross_entropy", ("LinearCrossEntropyLoss",), True, ("input", "linear_weight", "target"),
             "hidden features (the loss applies the linear head itself)", "class indices in [0, C) or ignore_index",
             None, _MEAN_SUM_NONE, "input (N, D), linear_weight (C, D), target (N,)", (),
             "class indices out of range and shape mismatches (raise)"),
    Contract("AdaptiveLogSoftmaxWithLoss", ("AdaptiveLogSoftmaxWithLoss",), False, ("input", "target"),
             "hidden features (the module applies its own heads)", "class indices in [0, n_classes)", None,
             ("mean",), "input (N, D), target (N,)", (),
             "targets out of range (the module raises, with a host read of its own)"),
)

_BY_FUNCTION = {c.name: c for c in CONTRACTS if c.functional}
_BY_MODULE = {m: c for c in CONTRACTS for m in c.modules}


def by_function(name: str) -> Optional[Contract]:
    """The contract of ``F.<name>``, if it is a loss."""
    return _BY_FUNCTION.get(name)


def by_module(name: str) -> Optional[Contract]:
    """The contract of the loss module ``nn.<name>``."""
    return _BY_MODULE.get(name)


def functional_names(with_clauses: bool = True) -> tuple[str, ...]:
    """The ``F`` losses (only those with a checked clause, by default): what is observed."""
    return tuple(c.name for c in CONTRACTS if c.functional and (c.clauses or not with_clauses))

"""The loss cases: every torch loss called healthily the way real code calls it, and the misuses
that torch accepts silently, each with what the sentinel should say.

``expect`` is ``(kind, clause)`` for a misuse, None for a healthy call (the run must be quiet).
``raises`` marks a misuse torch refuses by itself (on CPU): recorded so the table says which
families are silent, and checked so the claim stays true. Forms: ``F`` and ``module`` (both where
both exist); HF and Lightning cases are in ``frameworks.py``.

Decided: ``cross_entropy`` on ``log_softmax`` output is healthy. log_softmax is idempotent
(log_softmax(log_softmax(x)) = log_softmax(x), since log-probabilities log-sum-exp to 0), so the
loss, its gradient and the training are those of ``nll_loss(log_softmax(x))``: one wasted
normalisation, not a fault. The case is in the healthy list.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from losses.tasks import (
    CLASSES,
    CTC_C,
    SEQ_CLASSES,
    SEQ_LEN,
    Batch,
    Criterion,
    Tagger,
    Teacher,
    binary,
    classify,
    counts,
    frames,
    masks,
    mixup,
    mlp,
    multilabel,
    pairs,
    regression,
    segmentation,
    segnet,
    sequences,
    triplets,
)
from torch import nn
from torch.nn import functional as F

Step = Callable[[Criterion, nn.Module, Batch], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    loss: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], Batch]
    step: Step
    why: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    forms: tuple[str, ...] = ("F", "module")
    expect: Optional[tuple[str, str]] = None
    raises: Optional[type[BaseException]] = None
    attach: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Why the run is known to say something else today (outside the loss contracts); the test
    #: is a strict xfail.
    xfail: Optional[str] = None


def _plain(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1])


def _log_softmax(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(F.log_softmax(model(b[0]), dim=1), b[1])


def _softmax(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(F.softmax(model(b[0]), dim=1), b[1])


def _tagger_transposed(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]).transpose(1, 2), b[1])  # (N, L, C) -> (N, C, L), as the loss wants


def _tagger_flat(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(F.log_softmax(model(b[0]), dim=-1).reshape(-1, SEQ_CLASSES), b[1].reshape(-1))


def _distill(student_log: bool, teacher_log: bool, teacher_dim: int = 1) -> Step:
    """Knowledge distillation at temperature 2 against a fixed teacher."""

    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        s = model(b[0]) / 2
        t = (b[0] @ Teacher(0, 8, CLASSES).w) / 2
        s = F.log_softmax(s, dim=1) if student_log else F.softmax(s, dim=1)
        t = F.log_softmax(t, dim=teacher_dim) if teacher_log else F.softmax(t, dim=teacher_dim)
        return crit(s, t) * 4

    return step


def _soft_bce(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    """Distillation into a binary student: the teacher's probabilities are the targets."""
    return crit(model(b[0]), torch.sigmoid(b[0] @ Teacher(1, 8, 1).w))


def _smoothed(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1] * 0.9 + 0.05)  # label smoothing for binary targets


def _weighted_mse(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    per_sample = crit(model(b[0]), b[1])  # reduction="none"
    return (per_sample.squeeze(1) * torch.linspace(0.5, 1.5, len(per_sample))).mean()


def _boxes(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[0][:, :4] * 0.5)  # box offsets (N, 4)


def _outliers(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    y = b[1].clone()
    y[::7] += 20.0  # a few outliers: why Huber
    return crit(model(b[0]), y)


def _gaussian(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    out = model(b[0])  # (N, 2): mean and a raw scale
    return crit(out[:, :1], b[1], F.softplus(out[:, 1:]) + 1e-6)


def _rank(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    x1, x2, _ = b
    t1, t2 = (x1 @ Teacher(3, 8, 1).w).squeeze(1), (x2 @ Teacher(3, 8, 1).w).squeeze(1)
    return crit(model(x1).squeeze(1), model(x2).squeeze(1), torch.sign(t1 - t2))


def _rank01(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    x1, x2, _ = b
    t1, t2 = (x1 @ Teacher(3, 8, 1).w).squeeze(1), (x2 @ Teacher(3, 8, 1).w).squeeze(1)
    return crit(model(x1).squeeze(1), model(x2).squeeze(1), (t1 > t2).float())  # BUG: {0, 1}


def _distance(sign: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        x1, x2, same = b
        return crit((model(x1) - model(x2)).norm(dim=1), sign(same))

    return step


def _scores(sign: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        return crit(model(b[0]), sign(b[1] * 2 - 1))  # binary labels mapped to {-1, 1}

    return step


def _cosine(sign: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        x1, x2, same = b
        return crit(model(x1), model(x2), sign(same))

    return step


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _zero_one(t: torch.Tensor) -> torch.Tensor:
    return (t > 0).float()  # BUG: {-1, 1} labels stored as {0, 1}


def _triplet(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), model(b[1]), model(b[2]))


def _label_lists(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    """multilabel_margin's targets: the positive classes' indices, then -1."""
    x, multi_hot = b
    idx = torch.full(multi_hot.shape, -1, dtype=torch.long)
    for i, row in enumerate(multi_hot):
        pos = row.nonzero().flatten()
        idx[i, : len(pos)] = pos
    return crit(model(x), idx)


def _multi_hot_as_indices(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1].long())  # BUG: the multi-hot mask, not index lists


def _ctc(log_softmax: bool) -> Step:
    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        x, targets, in_len, tgt_len = b
        out = model(x)  # (T, N, C)
        return crit(out.log_softmax(2) if log_softmax else out, targets, in_len, tgt_len)

    return step


def _ctc_blank_in_targets(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    x, targets, in_len, tgt_len = b
    return crit(model(x).log_softmax(2), (targets - 1) % CTC_C, in_len, tgt_len)  # BUG: symbols 0..C-1


def _seg_255(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    x, mask = b
    return crit(model(x), (mask * 255).to(torch.uint8).float())  # BUG: a PNG mask, never divided by 255


def _pm1(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1] * 2 - 1)  # BUG: attributes stored as {-1, 1} (CelebA's files)


def _sequence_classes_last(log_softmax: bool) -> Step:
    """BUG: (N, L, C) logits fed as they are; the loss reads dim 1 (L) as the classes. L == C."""

    def step(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
        out = model(b[0])
        return crit(F.log_softmax(out, dim=-1) if log_softmax else out, b[1].clamp(min=0))

    return step


def _broadcast(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1].squeeze(1))  # BUG: (B, 1) against (B,)


def _multi_hot_ce(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[1])  # BUG: multi-label targets (rows sum to k) fed as class probabilities


def _teacher_logits_ce(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), b[0] @ Teacher(0, 8, CLASSES).w)  # BUG: teacher logits as soft targets


def _softplus_rate(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(F.softplus(model(b[0])), b[1])


def _log_var_net() -> nn.Module:
    """Mean and log-variance heads; the log-variance starts near log(0.1), a common init."""
    net = mlp(8, 2)
    with torch.no_grad():
        net[2].bias[1] = -2.3
    return net


def _gaussian_log_var(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    out = model(b[0])
    return crit(out[:, :1], b[1], out[:, 1:])  # BUG: a log-variance passed as the variance


class HiddenClassifier(nn.Module):
    """A body giving hidden states, with the fused heads that take them (and the head's weight)."""

    def __init__(self, head: str) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        if head == "weight":
            self.weight = nn.Parameter(torch.randn(CLASSES, 16) * 0.1)
        elif head == "fused":
            self.fused = nn.LinearCrossEntropyLoss(16, CLASSES)
        else:
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(16, CLASSES, cutoffs=[2], div_value=2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _linear_ce(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return crit(model(b[0]), model.weight, b[1])


def _linear_ce_module(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return model.fused(model(b[0]), b[1])


def _adaptive(crit: Criterion, model: nn.Module, b: Batch) -> torch.Tensor:
    return model.adaptive(model(b[0]), b[1]).loss


def _clf() -> nn.Module:
    return mlp(8, CLASSES)


def _square_tagger() -> nn.Module:
    return Tagger(classes=SEQ_LEN)  # L == C: torch accepts (N, L, C) as (N, C, d1)


def _square_sequences(g: torch.Generator) -> Batch:
    tokens, y = sequences(g)
    return tokens, torch.where(y < 0, y, y % SEQ_LEN)


HEALTHY: list[Case] = [
    Case("ce-logits", "cross_entropy", _clf, classify, _plain, "a classifier's logits"),
    Case("ce-label-smoothing-weights", "cross_entropy", _clf, classify, _plain, "label smoothing and class weights",
         kwargs={"label_smoothing": 0.1, "weight": torch.tensor([1.0, 2.0, 1.0, 0.5, 1.0])}),
    Case("ce-mixup-prob-targets", "cross_entropy", _clf, mixup, _plain, "mixup: class-probability targets"),
    Case("ce-on-log-softmax", "cross_entropy", _clf, classify, _log_softmax,
         "log_softmax before cross_entropy: idempotent, decided healthy"),
    Case("ce-seq-ignore-index", "cross_entropy", Tagger, sequences, _tagger_transposed,
         "(N, C, L) token tagging, padding at -100, summed", kwargs={"reduction": "sum"}),
    Case("ce-segmentation-255", "cross_entropy", lambda: segnet(4), segmentation, _plain,
         "(N, C, H, W) segmentation, border ignored at 255", kwargs={"ignore_index": 255}),
    Case("nll-log-softmax", "nll_loss", _clf, classify, _log_softmax, "log_softmax then nll_loss"),
    Case("nll-log-softmax-module-sum", "nll_loss", lambda: mlp(8, CLASSES, nn.LogSoftmax(dim=1)), classify, _plain,
         "a model ending in nn.LogSoftmax, summed", kwargs={"reduction": "sum"}),
    Case("nll-seq-flat-ignore", "nll_loss", Tagger, sequences, _tagger_flat,
         "flattened (N*L, C) log-probabilities with -100 padding"),
    Case("bce-sigmoid", "binary_cross_entropy", lambda: mlp(8, 1, nn.Sigmoid()), binary, _plain,
         "a sigmoid output and {0, 1} targets"),
    Case("bce-soft-targets", "binary_cross_entropy", lambda: mlp(8, 1, nn.Sigmoid()), binary, _soft_bce,
         "distillation: the teacher's probabilities as targets"),
    Case("bcel-multilabel-pos-weight", "binary_cross_entropy_with_logits", lambda: mlp(8, CLASSES), multilabel,
         _plain, "multi-label logits with pos_weight", kwargs={"pos_weight": torch.full((CLASSES,), 2.0)}),
    Case("bcel-smoothed", "binary_cross_entropy_with_logits", lambda: mlp(8, 1), binary, _smoothed,
         "label-smoothed binary targets 0.05/0.95"),
    Case("bcel-segmentation", "binary_cross_entropy_with_logits", lambda: segnet(1), masks, _plain,
         "binary segmentation masks in {0, 1}"),
    Case("kl-distillation", "kl_div", _clf, classify, _distill(True, False), "distillation, batchmean",
         kwargs={"reduction": "batchmean"}),
    Case("kl-log-target", "kl_div", _clf, classify, _distill(True, True), "log_target=True",
         kwargs={"reduction": "batchmean", "log_target": True}),
    Case("mse-regression", "mse_loss", lambda: mlp(8, 1), regression, _plain, "(B, 1) against (B, 1)"),
    Case("mse-none-weighted", "mse_loss", lambda: mlp(8, 1), regression, _weighted_mse,
         "reduction='none' and per-sample weights", kwargs={"reduction": "none"}),
    Case("l1-regression", "l1_loss", lambda: mlp(8, 1), regression, _plain, "L1 regression"),
    Case("huber-outliers", "huber_loss", lambda: mlp(8, 1), regression, _outliers, "Huber with outliers",
         kwargs={"delta": 1.0}),
    Case("smooth-l1-boxes", "smooth_l1_loss", lambda: mlp(8, 4), regression, _boxes, "box regression, beta 1/9",
         kwargs={"beta": 1 / 9}),
    Case("poisson-log-rate", "poisson_nll_loss", lambda: mlp(8, 1), counts, _plain, "log-rate output (log_input)"),
    Case("poisson-rate-softplus", "poisson_nll_loss", lambda: mlp(8, 1), counts, _softplus_rate,
         "a softplus rate with log_input=False", kwargs={"log_input": False}),
    Case("gaussian-softplus-var", "gaussian_nll_loss", lambda: mlp(8, 2), regression, _gaussian,
         "heteroscedastic regression, var = softplus + eps"),
    Case("margin-ranking", "margin_ranking_loss", lambda: mlp(8, 1, bias=False), pairs, _rank, "pairwise ranking, {-1, 1}",
         kwargs={"margin": 0.1}),
    Case("hinge-embedding", "hinge_embedding_loss", lambda: mlp(8, 4, bias=False), pairs, _distance(_keep),
         "distances of pairs, {-1, 1}", kwargs={"margin": 2.0}),
    Case("soft-margin", "soft_margin_loss", lambda: mlp(8, 1), binary, _scores(_keep), "binary, {-1, 1}"),
    Case("cosine-embedding", "cosine_embedding_loss", lambda: mlp(8, 4), pairs, _cosine(_keep), "{-1, 1} pairs"),
    Case("triplet", "triplet_margin_loss", lambda: mlp(8, 4, bias=False), triplets, _triplet, "anchor/positive/negative"),
    Case("triplet-cosine-distance", "triplet_margin_with_distance_loss", lambda: mlp(8, 4, bias=False), triplets, _triplet,
         "a cosine distance", kwargs={"distance_function": lambda a, b: 1 - F.cosine_similarity(a, b)}),
    Case("multi-margin", "multi_margin_loss", _clf, classify, _plain, "class indices"),
    Case("multilabel-margin", "multilabel_margin_loss", lambda: mlp(8, CLASSES), multilabel, _label_lists,
         "index lists padded with -1"),
    Case("multilabel-soft-margin", "multilabel_soft_margin_loss", lambda: mlp(8, CLASSES), multilabel, _plain,
         "multi-hot {0, 1}"),
    Case("linear-ce", "linear_cross_entropy", lambda: HiddenClassifier("weight"), classify, _linear_ce,
         "hidden states and the head's weight, fused", forms=("F",),
         xfail="core: missing_zero_grad measures the stale gradients when the backward reaches the model's "
               "outputs; the head weight, used by the loss itself, already holds this step's gradient then"),
    Case("linear-ce-module", "LinearCrossEntropyLoss", lambda: HiddenClassifier("fused"), classify, _linear_ce_module,
         "the fused head as a module of the model", forms=("in-model",)),
    Case("adaptive-log-softmax", "AdaptiveLogSoftmaxWithLoss", lambda: HiddenClassifier("adaptive"), classify, _adaptive,
         "an adaptive softmax head of the model", forms=("in-model",)),
    Case("ctc-blank-padded", "ctc_loss", lambda: nn.Linear(8, CTC_C), frames, _ctc(True),
         "(T, N, C) log_softmax(2), blank 0, targets padded with 0 past their lengths", kwargs={"reduction": "sum"}),
]

MISUSES: list[Case] = [
    Case("nll-on-logits", "nll_loss", _clf, classify, _plain, "nll_loss on raw logits",
         expect=("invalid_loss_input", "log_probabilities")),
    Case("nll-on-softmax", "nll_loss", _clf, classify, _softmax, "nll_loss on softmax probabilities",
         expect=("probabilities_as_logits", "probabilities_as_logits")),
    Case("ce-on-softmax", "cross_entropy", lambda: mlp(8, CLASSES, nn.Softmax(dim=1)), classify, _plain,
         "a model ending in nn.Softmax", expect=("probabilities_as_logits", "probabilities_as_logits")),
    Case("bcel-on-sigmoid", "binary_cross_entropy_with_logits", lambda: mlp(8, 1, nn.Sigmoid()), binary, _plain,
         "a sigmoid output into the logits loss", expect=("probabilities_as_logits", "probabilities_as_logits")),
    Case("bcel-targets-0-255", "binary_cross_entropy_with_logits", lambda: segnet(1), masks, _seg_255,
         "PNG masks on a 0-255 scale", expect=("invalid_target", "target_range")),
    Case("bce-targets-0-255", "binary_cross_entropy", lambda: nn.Sequential(segnet(1), nn.Sigmoid()), masks,
         _seg_255, "PNG masks on a 0-255 scale, after a sigmoid", raises=RuntimeError),
    Case("bcel-targets-pm1", "binary_cross_entropy_with_logits", lambda: mlp(8, CLASSES), multilabel, _pm1,
         "attributes stored as {-1, 1}", expect=("invalid_target", "target_range")),
    Case("kl-input-probabilities", "kl_div", _clf, classify, _distill(False, False),
         "probabilities where log-probabilities belong", kwargs={"reduction": "batchmean"},
         expect=("invalid_loss_input", "log_probabilities")),
    Case("kl-target-log-probs", "kl_div", _clf, classify, _distill(True, True),
         "log-probability targets without log_target (the loss is NaN)", kwargs={"reduction": "batchmean"},
         expect=("invalid_target", "target_probabilities"), attach={"on_nonfinite": "record"}),
    Case("kl-target-wrong-dim", "kl_div", _clf, classify, _distill(True, False, teacher_dim=0),
         "the teacher's softmax over the batch: rows do not sum to 1", kwargs={"reduction": "batchmean"},
         expect=("invalid_target", "target_probabilities")),
    Case("nll-class-dim-last", "nll_loss", _square_tagger, _square_sequences, _sequence_classes_last(True),
         "(N, L, C) log-probabilities over the last dim, L == C", expect=("invalid_loss_input", "class_dim")),
    Case("ce-class-dim-last", "cross_entropy", _square_tagger, _square_sequences, _sequence_classes_last(False),
         "(N, L, C) logits from a Linear, not transposed, L == C", expect=("invalid_loss_input", "class_dim")),
    Case("mse-broadcast", "mse_loss", lambda: mlp(8, 1), regression, _broadcast, "(B, 1) against (B,)",
         expect=("loss_broadcast", "loss_broadcast")),
    Case("l1-broadcast", "l1_loss", lambda: mlp(8, 1), regression, _broadcast, "(B, 1) against (B,)",
         expect=("loss_broadcast", "loss_broadcast")),
    Case("margin-ranking-01", "margin_ranking_loss", lambda: mlp(8, 1, bias=False), pairs, _rank01, "{0, 1} targets",
         kwargs={"margin": 0.1}, expect=("invalid_target", "target_signs")),
    Case("hinge-embedding-01", "hinge_embedding_loss", lambda: mlp(8, 4, bias=False), pairs, _distance(_zero_one),
         "{0, 1} targets", kwargs={"margin": 2.0}, expect=("invalid_target", "target_signs")),
    Case("soft-margin-01", "soft_margin_loss", lambda: mlp(8, 1), binary, _scores(_zero_one), "{0, 1} targets",
         expect=("invalid_target", "target_signs")),
    Case("cosine-embedding-01", "cosine_embedding_loss", lambda: mlp(8, 4), pairs, _cosine(_zero_one),
         "{0, 1} targets", expect=("invalid_target", "target_signs")),
    Case("multilabel-margin-multi-hot", "multilabel_margin_loss", lambda: mlp(8, CLASSES), multilabel,
         _multi_hot_as_indices, "a multi-hot mask where index lists belong",
         expect=("invalid_target", "target_indices")),
    Case("multilabel-soft-margin-pm1", "multilabel_soft_margin_loss", lambda: mlp(8, CLASSES), multilabel, _pm1,
         "{-1, 1} targets", expect=("invalid_target", "target_range")),
    Case("poisson-rate-as-log-rate", "poisson_nll_loss", lambda: mlp(8, 1), counts, _softplus_rate,
         "a softplus rate with the default log_input=True", expect=("invalid_loss_input", "log_input")),
    Case("gaussian-log-var", "gaussian_nll_loss", _log_var_net, regression, _gaussian_log_var,
         "a log-variance as the variance (negative entries)", raises=ValueError),
    Case("ctc-on-logits", "ctc_loss", lambda: nn.Linear(8, CTC_C), frames, _ctc(False),
         "raw scores, no log_softmax", expect=("invalid_loss_input", "log_probabilities")),
    Case("ctc-blank-in-targets", "ctc_loss", lambda: nn.Linear(8, CTC_C), frames, _ctc_blank_in_targets,
         "symbols numbered from 0, which is the blank", expect=("invalid_target", "target_not_blank")),
    Case("ce-multi-hot-targets", "cross_entropy", _clf, multilabel, _multi_hot_ce,
         "multi-label targets as class probabilities", expect=("invalid_target", "target_probabilities")),
    Case("ce-teacher-logits-targets", "cross_entropy", _clf, classify, _teacher_logits_ce,
         "a teacher's logits as soft targets", expect=("invalid_target", "target_probabilities")),
]

CASES = HEALTHY + MISUSES

"""Small learnable tasks for the loss cases: a model, a batch source, and how real code calls a loss.

Every task is a tiny model of the kind the loss is used with (a classifier for the
cross-entropy family, a regressor for MSE/Huber, a count model for Poisson NLL, an embedding
for the margin and triplet losses, a frame classifier for CTC, a segmentation net), trained on
data drawn from a fixed "teacher", so a healthy run learns.

A loss is called in one of two forms, chosen by the case: ``F`` (``F.<name>(...)``, looked up
at call time, as a loop does) or ``module`` (``nn.<Name>Loss(...)``). Both get the same
positional arguments and keywords, since torch's loss modules take the functional keywords.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, ...]
Criterion = Callable[..., torch.Tensor]

#: The nn.Module of each functional loss.
MODULE_OF: dict[str, Callable[..., nn.Module]] = {
    "cross_entropy": nn.CrossEntropyLoss,
    "nll_loss": nn.NLLLoss,
    "binary_cross_entropy": nn.BCELoss,
    "binary_cross_entropy_with_logits": nn.BCEWithLogitsLoss,
    "kl_div": nn.KLDivLoss,
    "mse_loss": nn.MSELoss,
    "l1_loss": nn.L1Loss,
    "huber_loss": nn.HuberLoss,
    "smooth_l1_loss": nn.SmoothL1Loss,
    "poisson_nll_loss": nn.PoissonNLLLoss,
    "gaussian_nll_loss": nn.GaussianNLLLoss,
    "margin_ranking_loss": nn.MarginRankingLoss,
    "hinge_embedding_loss": nn.HingeEmbeddingLoss,
    "soft_margin_loss": nn.SoftMarginLoss,
    "cosine_embedding_loss": nn.CosineEmbeddingLoss,
    "triplet_margin_loss": nn.TripletMarginLoss,
    "triplet_margin_with_distance_loss": nn.TripletMarginWithDistanceLoss,
    "multi_margin_loss": nn.MultiMarginLoss,
    "multilabel_margin_loss": nn.MultiLabelMarginLoss,
    "multilabel_soft_margin_loss": nn.MultiLabelSoftMarginLoss,
    "ctc_loss": nn.CTCLoss,
}


def criterion(name: str, form: str, **kwargs: Any) -> Criterion:
    """The loss ``name`` as the case calls it: ``F.<name>`` looked up at each call, or its module."""
    if form == "module":
        return MODULE_OF[name](**kwargs)

    def call(*args: torch.Tensor) -> torch.Tensor:
        return getattr(F, name)(*args, **kwargs)

    return call


def mlp(d_in: int, d_out: int, *last: nn.Module, hidden: int = 32, bias: bool = True) -> nn.Sequential:
    """``bias=False`` for scorers and embeddings compared in pairs, where a last bias cancels
    (and gets exactly zero gradient)."""
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out, bias=bias), *last)


class Teacher:
    """Fixed random weights that make the labels, so every task is learnable."""

    def __init__(self, seed: int, *shape: int) -> None:
        g = torch.Generator().manual_seed(1000 + seed)
        self.w = torch.randn(*shape, generator=g)


# -- data ----------------------------------------------------------------------------------
CLASSES = 5


def classify(g: torch.Generator, n: int = 16) -> Batch:
    """x (n, 8), y class indices in [0, 5) from a linear teacher."""
    x = torch.randn(n, 8, generator=g)
    return x, (x @ Teacher(0, 8, CLASSES).w).argmax(1)


def mixup(g: torch.Generator) -> Batch:
    """Mixed inputs and the matching mixed one-hot targets (class probabilities)."""
    x, y = classify(g)
    lam = 0.7
    perm = torch.randperm(len(x), generator=g)
    onehot = F.one_hot(y, CLASSES).float()
    return lam * x + (1 - lam) * x[perm], lam * onehot + (1 - lam) * onehot[perm]


def binary(g: torch.Generator, n: int = 16) -> Batch:
    """x (n, 8), y in {0., 1.} of shape (n, 1)."""
    x = torch.randn(n, 8, generator=g)
    return x, (x @ Teacher(1, 8, 1).w > 0).float()


def multilabel(g: torch.Generator, n: int = 16) -> Batch:
    """x (n, 8), multi-hot y in {0., 1.} of shape (n, 5)."""
    x = torch.randn(n, 8, generator=g)
    return x, (x @ Teacher(2, 8, CLASSES).w > 0.5).float()


def regression(g: torch.Generator, n: int = 16) -> Batch:
    """x (n, 8), y of shape (n, 1)."""
    x = torch.randn(n, 8, generator=g)
    return x, x @ Teacher(3, 8, 1).w + 0.1 * torch.randn(n, 1, generator=g)


def counts(g: torch.Generator, n: int = 16) -> Batch:
    """x (n, 8), Poisson counts y of shape (n, 1)."""
    x = torch.randn(n, 8, generator=g)
    return x, torch.poisson(torch.exp(0.3 * (x @ Teacher(4, 8, 1).w)), generator=g)


def pairs(g: torch.Generator, n: int = 16) -> Batch:
    """Two inputs, and +1 where they share a class, -1 where not."""
    x1, y1 = classify(g, n)
    x2, y2 = classify(g, n)
    return x1, x2, (y1 == y2).float() * 2 - 1


def triplets(g: torch.Generator, n: int = 16) -> Batch:
    """Anchor, a positive (the anchor plus noise) and a negative (another input)."""
    a = torch.randn(n, 8, generator=g)
    return a, a + 0.1 * torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)


#: Sequence tasks: L positions, C classes, V tokens.
SEQ_LEN, SEQ_CLASSES, VOCAB = 6, 7, 20


def sequences(g: torch.Generator, n: int = 8, length: int = SEQ_LEN) -> Batch:
    """Token ids (n, L) and per-token classes (n, L), the last 1-2 positions padded with -100."""
    tokens = torch.randint(0, VOCAB, (n, length), generator=g)
    y = (tokens * 3 + 1) % SEQ_CLASSES
    pad = torch.randint(1, 3, (n,), generator=g)
    y[torch.arange(length).expand(n, length) >= (length - pad)[:, None]] = -100
    return tokens, y


class Tagger(nn.Module):
    """Token ids (N, L) -> per-token logits (N, L, C), as a Linear over the last dim makes them."""

    def __init__(self, classes: int = SEQ_CLASSES) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(tokens)))


def segmentation(g: torch.Generator, n: int = 4) -> Batch:
    """Images (n, 3, 6, 6), per-pixel classes in [0, 4), the border marked 255 (ignored)."""
    x = torch.randn(n, 3, 6, 6, generator=g)
    y = torch.einsum("nchw,ck->nkhw", x, Teacher(5, 3, 4).w).argmax(1)
    y[:, 0, :] = 255
    y[:, :, 0] = 255
    return x, y


def segnet(classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))


def masks(g: torch.Generator, n: int = 4) -> Batch:
    """Images (n, 3, 6, 6) and binary masks (n, 1, 6, 6) in {0., 1.}."""
    x = torch.randn(n, 3, 6, 6, generator=g)
    return x, (x[:, :1] + x[:, 1:2] > 0).float()


#: CTC: T frames, N sequences, C symbols (blank is 0), targets up to S long.
CTC_T, CTC_N, CTC_C, CTC_S = 12, 4, 6, 4


def frames(g: torch.Generator) -> Batch:
    """Frames (T, N, 8), targets (N, S) in [1, C) padded with 0 past their lengths, lengths."""
    x = torch.randn(CTC_T, CTC_N, 8, generator=g)
    targets = torch.randint(1, CTC_C, (CTC_N, CTC_S), generator=g)
    lengths = torch.randint(2, CTC_S + 1, (CTC_N,), generator=g)
    targets[torch.arange(CTC_S).expand(CTC_N, CTC_S) >= lengths[:, None]] = 0
    return x, targets, torch.full((CTC_N,), CTC_T, dtype=torch.long), lengths

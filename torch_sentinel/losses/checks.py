"""The clauses' figures on the device: tensors in, a few 0-d device tensors out, no host read.

Each check reduces what one clause needs into a handful of scalars: the range of a tensor, how
far its rows over the class dim are from summing to 1 (probabilities) and from log-sum-exp 0
(log-probabilities), the fraction of targets outside {-1, 1}, of index-list rows naming a class
twice, of CTC labels equal to the blank. The host turns them into verdicts at flush
(``verdicts.py``). A figure is folded across the calls of one step by its *fold*: names ending
in ``min`` or ``lo`` keep the smallest value, the others the largest.

Only a bounded slice is read: at most :data:`ROW_ELEMENTS` elements of the leading samples, so
a language model's (B*T, V) logits cost a few MB of temporaries, not another copy of the logits.
No ``if`` depends on a tensor's values; shapes and dtypes are host facts.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .contracts import Contract

__all__ = ["INPUT_CHECKS", "ROW_ELEMENTS", "TARGET_CHECKS", "distribution", "figures", "folds_by_min", "layout",
           "log_probabilities", "probabilities", "rows", "tolerance"]

#: The most elements of one tensor a check reads (4 MB of float32).
ROW_ELEMENTS = 1 << 20

#: The figures of each check; a loss runs the checks its clauses need, and no more.
_NAMES: dict[str, tuple[str, ...]] = {
    "values": ("min", "max"),
    "probabilities": ("min", "max", "sum_dev_max"),  # is the input already a distribution?
    "distribution": ("min", "max", "sum_off"),  # is every target row a distribution?
    "log_probabilities": ("lse_lo", "lse_hi", "lse_off"),  # do rows log-sum-exp to 0?
    "signs": ("off",),
    "index_lists": ("repeat",),
    "not_blank": ("blank",),
}

#: What is measured of the input, per loss.
INPUT_CHECKS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("probabilities",),
    "nll_loss": ("probabilities", "log_probabilities"),
    "binary_cross_entropy_with_logits": ("values",),
    "kl_div": ("values", "log_probabilities"),
    "poisson_nll_loss": ("values",),
    "ctc_loss": ("values", "log_probabilities"),
}
#: What is measured of the target, per loss (``kl_div``: see :data:`KL_LOG_TARGET`).
TARGET_CHECKS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("distribution",),  # class-probability targets only (index targets: torch checks)
    "binary_cross_entropy_with_logits": ("values",),
    "kl_div": ("distribution",),
    "poisson_nll_loss": ("values",),
    "margin_ranking_loss": ("signs",),
    "hinge_embedding_loss": ("signs",),
    "soft_margin_loss": ("signs",),
    "cosine_embedding_loss": ("signs",),
    "multilabel_soft_margin_loss": ("values",),
    "multilabel_margin_loss": ("index_lists",),
    "ctc_loss": ("not_blank",),
}

#: ``kl_div`` with ``log_target=True``: its targets are log-probabilities.
KL_LOG_TARGET = ("values", "log_probabilities")


def _checks(contract: Contract, target: bool, log_target: bool = False) -> tuple[str, ...]:
    if not target:
        return INPUT_CHECKS.get(contract.name, ())
    if contract.name == "kl_div" and log_target:
        return KL_LOG_TARGET
    return TARGET_CHECKS.get(contract.name, ())


@functools.lru_cache(maxsize=64)
def layout(contract: Contract) -> tuple[str, ...]:
    """The figure names a call of ``contract`` may produce, in block order (``x_`` input,
    ``t_`` target)."""
    names: list[str] = []
    for prefix, checks in (("x_", _checks(contract, False)), ("t_", _checks(contract, True) + _checks(contract, True, True))):
        for check in checks:
            names += [prefix + n for n in _NAMES[check] if prefix + n not in names]
    return tuple(names)


def folds_by_min(name: str) -> bool:
    return name.endswith(("min", "lo"))


def rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A float32 (rows, classes) view of ``t`` with ``dim`` as the classes: at most
    :data:`ROW_ELEMENTS` elements, from the leading samples."""
    d = t.detach()
    if d.ndim == 0:
        d = d.reshape(1)
    dim = dim % d.ndim
    if d.numel() > ROW_ELEMENTS and d.ndim > 1:
        lead = 1 if dim == 0 else 0
        keep = max(1, ROW_ELEMENTS // max(1, d.numel() // max(1, d.shape[lead])))
        d = d.narrow(lead, 0, min(keep, d.shape[lead]))
    return d.movedim(dim, -1).reshape(-1, d.shape[dim]).float()


def tolerance(dtype: torch.dtype) -> float:
    """How far a row of a normalised tensor may sum from 1 (or log-sum-exp from 0) in ``dtype``:
    float32 softmax rows sum to 1 within ~1e-6 even over 50k classes; float16/bfloat16 within
    about their 8-11 bits."""
    return 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-3


def probabilities(r: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows ``r`` (from :func:`rows`): their range and the largest |row sum - 1|: non-negative
    rows within :func:`tolerance` of 1 are a distribution, not logits."""
    mn, mx = torch.aminmax(r)
    return {"min": mn, "max": mx, "sum_dev_max": (r.sum(1) - 1.0).abs().amax()}


def distribution(r: torch.Tensor, tol: float) -> dict[str, torch.Tensor]:
    """Rows ``r``: their range and the fraction of rows whose sum is off 1 by more than ``tol``;
    a row summing to 0 (a target row zeroed to mask a padding position) is not counted off."""
    mn, mx = torch.aminmax(r)
    sums = r.sum(1)
    return {"min": mn, "max": mx, "sum_off": (((sums - 1.0).abs() > tol) & (sums.abs() > tol)).float().mean()}


def log_probabilities(r: torch.Tensor, tol: float) -> dict[str, torch.Tensor]:
    """Rows ``r``: the range of their log-sum-exp and the fraction off 0 by more than ``tol``."""
    lse = torch.logsumexp(r, 1)
    lo, hi = torch.aminmax(lse)
    return {"lse_lo": lo, "lse_hi": hi, "lse_off": (lse.abs() > tol).float().mean()}


def values(r: torch.Tensor) -> dict[str, torch.Tensor]:
    mn, mx = torch.aminmax(r)
    return {"min": mn, "max": mx}


def signs(r: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fraction of targets that are not -1 or 1."""
    return {"off": (r.abs() != 1.0).float().mean()}


def index_lists(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """``multilabel_margin_loss`` targets: the fraction of rows that list a class twice before
    their first -1 (a multi-hot mask read as index lists lists 0 and 1 over and over)."""
    r = t.detach().reshape(-1, t.shape[-1]) if t.ndim else t.detach().reshape(1, 1)
    listed = torch.cumprod((r >= 0).to(torch.int32), dim=1).bool()
    # unlisted entries get distinct values below -1, so only listed classes can repeat
    filler = -2 - torch.arange(r.shape[1], device=r.device).expand_as(r)
    s = torch.sort(torch.where(listed, r.long(), filler), dim=1).values
    repeats = (s[:, 1:] == s[:, :-1]).any(1) if r.shape[1] > 1 else torch.zeros(r.shape[0], dtype=torch.bool,
                                                                                device=r.device)
    return {"repeat": repeats.float().mean()}


def not_blank(targets: torch.Tensor, target_lengths: object, blank: int) -> dict[str, torch.Tensor]:
    """CTC: the fraction of labels (within their lengths) equal to the blank."""
    d = targets.detach()
    is_blank = d == blank
    if d.ndim == 2:
        lengths = torch.as_tensor(target_lengths, device=d.device)  # a host list is copied up, never read back
        within = torch.arange(d.shape[1], device=d.device) < lengths.reshape(-1, 1)
        count = within.sum().clamp(min=1)
        return {"blank": (is_blank & within).sum() / count}
    return {"blank": is_blank.float().mean()}


def _run(check: str, t: torch.Tensor, dim: Optional[int], extra: dict[str, object]) -> dict[str, torch.Tensor]:
    if check == "index_lists":
        return index_lists(t)
    if check == "not_blank":
        return not_blank(t, extra.get("target_lengths"), int(extra.get("blank", 0)))  # type: ignore[call-overload]
    r = rows(t, dim if dim is not None else -1)
    if check == "values":
        return values(r)
    if check == "signs":
        return signs(r)
    if check == "probabilities":
        return probabilities(r)
    if check == "distribution":
        return distribution(r, tolerance(t.dtype))
    return log_probabilities(r, tolerance(t.dtype))


def figures(contract: Contract, tensors: dict[str, torch.Tensor], dims: tuple[Optional[int], Optional[int]],
            extra: dict[str, object]) -> dict[str, torch.Tensor]:
    """The figures of one call: ``tensors`` holds ``input`` and ``target`` (CTC's lengths and
    blank, and KL's ``log_target``, in ``extra``); ``dims`` the input's and the target's class dims."""
    out: dict[str, torch.Tensor] = {}
    for prefix, key, dim in (("x_", "input", dims[0]), ("t_", "target", dims[1])):
        t = tensors.get(key)
        if t is None or not t.numel():
            continue
        for check in _checks(contract, key == "target", bool(extra.get("log_target"))):
            out.update({prefix + k: v for k, v in _run(check, t, dim, extra).items()})
    return out

"""Device-side statistics for loss-spike forensics: plain functions of tensors, no host reads.

Each returns a small device tensor; callers write it into a ledger slot or the spike ring
(``spike_ring.py``). They run inside hooks (eager or traced by torch.compile), so they only
launch tensor ops: no ``.item()``, no ``if`` on a tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_POSITIONS", "max_attention_logit", "max_attention_logits", "mean_logsumexp", "mha_max_logit",
           "stacked_norms"]

#: A 0-d zero per (device, dtype): ``baddbmm``'s ignored input (beta=0), so the scores cost one
#: launch and no allocation op.
_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

#: The attention logits are taken over the first sequence of the batch and its first this many
#: query and key positions: ``H x 256 x 256`` scores at most, whatever the batch and context
#: length (a long-context model would otherwise materialise every score that flash attention
#: never stores).
ATTENTION_POSITIONS = 256


def _detached(t: torch.Tensor) -> torch.Tensor:
    """``t`` cut from autograd where an op on it would be recorded. The hooks call these
    functions under ``no_grad``, where a ``detach`` would be one dispatched op a tensor for
    nothing."""
    return t.detach() if t.requires_grad and torch.is_grad_enabled() else t


def _first_sequence(t: torch.Tensor) -> torch.Tensor:
    """``(..., L, E)`` as ``(H, L', E)``: the first entry of every leading batch dim, heads kept,
    ``L'`` at most :data:`ATTENTION_POSITIONS` (sliced only when longer: one op less)."""
    t = _detached(t)
    while t.dim() > 3:
        t = t[0]
    if t.dim() == 2:
        t = t.unsqueeze(0)
    return t[:, :ATTENTION_POSITIONS] if t.shape[1] > ATTENTION_POSITIONS else t


def _zero(like: torch.Tensor) -> torch.Tensor:
    key = (like.device, like.dtype)
    zero = _ZEROS.get(key)
    if zero is None:
        zero = _ZEROS[key] = torch.zeros((), device=like.device, dtype=like.dtype)
    return zero


def _query_key(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first sequence's queries and keys as ``(H, L', E)`` and ``(H, S', E)``, the queries
    of a key head's group stacked along ``L'`` (grouped-query attention)."""
    q0, k0 = _first_sequence(q), _first_sequence(k)
    hq, hk = q0.shape[0], k0.shape[0]
    if hq != hk and hk and hq % hk == 0:  # grouped-query attention: the queries of a group share a key head
        q0 = q0.reshape(hk, -1, q0.shape[-1])
    return q0, k0


def _softmax_scale(q0: torch.Tensor, scale: Optional[float]) -> float:
    return (1.0 / math.sqrt(q0.shape[-1])) if scale is None else float(scale)


def max_attention_logit(q: torch.Tensor, k: torch.Tensor, scale: Optional[float] = None,
                        out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The largest scaled ``q . k`` of the first sequence: the logit the softmax sees, masks not
    applied (a causal mask hides half of these pairs; the largest of all pairs grows as the
    largest visible one does when q and k grow).

    Args:
        q: queries ``(N, ..., Hq, L, E)`` as ``scaled_dot_product_attention`` takes them.
        k: keys ``(N, ..., H, S, E)``; ``Hq`` a multiple of ``H`` (grouped-query attention).
        scale: the softmax scale; ``1/sqrt(E)`` when None, as SDPA's default.
        out: a 0-d tensor of the scores' dtype to write the result into (one launch less).
    """
    q0, k0 = _query_key(q, k)
    scores = torch.baddbmm(_zero(q0), q0, k0.transpose(-1, -2), beta=0.0, alpha=_softmax_scale(q0, scale))
    if out is not None and out.dtype == scores.dtype:
        return torch.amax(scores, dim=(0, 1, 2), out=out)
    return scores.amax()


def max_attention_logits(calls: Sequence[tuple[torch.Tensor, torch.Tensor, Optional[float]]]) -> list[tuple[list[int], torch.Tensor]]:
    """:func:`max_attention_logit` of each ``(q, k, scale)`` call, batched: calls whose first
    sequences share a shape, dtype, device and scale are stacked into one product and one max
    (two ``cat``s, a ``baddbmm`` and an ``amax`` for the group, where one by one each call costs
    its own product and max). Returns ``(indices into calls, their maxima)`` per group, the
    maxima a vector in the scores' dtype. The same values as one by one: each score is the same
    dot product, and a max does not depend on the order it is taken in."""
    #: (shapes, dtypes, device, scale) -> (indices into calls, their q0s, their k0s)
    groups: dict[tuple[Any, ...], tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = {}
    for i, (q, k, scale) in enumerate(calls):
        q0, k0 = _query_key(q, k)
        key = (q0.shape, k0.shape, q0.dtype, k0.dtype, q0.device, _softmax_scale(q0, scale))
        members, qs, ks = groups.setdefault(key, ([], [], []))
        members.append(i)
        qs.append(q0)
        ks.append(k0)
    out = []
    for key, (members, qs, ks) in groups.items():
        s = key[-1]
        if len(members) == 1:
            q0, k0 = qs[0], ks[0]
        else:
            q0 = torch.cat(qs)  # (G * H, L', E): a cat, where a stack takes a flatten more
            k0 = torch.cat(ks)
        scores = torch.baddbmm(_zero(q0), q0, k0.transpose(-1, -2), beta=0.0, alpha=s)
        out.append((members, scores.view(len(members), -1).amax(dim=1)))
    return out


def mha_max_logit(module: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`max_attention_logit` of an ``nn.MultiheadAttention`` call, recomputing the first
    sequence's q and k from its input projections (the module keeps them inside its forward)."""
    e, h = module.embed_dim, module.num_heads
    batched = query.dim() == 3
    if batched:
        q_in = query[0] if module.batch_first else query[:, 0]
        k_in = key[0] if module.batch_first else key[:, 0]
    else:
        q_in, k_in = query, key
    q_in, k_in = _detached(q_in)[:ATTENTION_POSITIONS], _detached(k_in)[:ATTENTION_POSITIONS]
    bias = module.in_proj_bias
    if module.in_proj_weight is not None:
        w_q, w_k = module.in_proj_weight[:e], module.in_proj_weight[e : 2 * e]
    else:
        w_q, w_k = module.q_proj_weight, module.k_proj_weight
    b_q = bias[:e] if bias is not None else None
    b_k = bias[e : 2 * e] if bias is not None else None
    q = F.linear(q_in, _detached(w_q), None if b_q is None else _detached(b_q))
    k = F.linear(k_in, _detached(w_k), None if b_k is None else _detached(b_k))
    dh = e // h
    return max_attention_logit(q.view(-1, h, dh).transpose(0, 1), k.view(-1, h, dh).transpose(0, 1), out=out)


def mean_logsumexp(logits: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The mean log-sum-exp over the vocabulary (last dim) of the first sequence's positions:
    the softmax normaliser ``log Z`` that a z-loss keeps near 0. ``out``: a float32 0-d tensor
    to write it into.

    Taken as ``max(x) - max(log_softmax(x))`` per position (``log_softmax(x) = x - log Z``):
    ``log_softmax`` is one fused kernel on CPU, the one the loop's cross-entropy runs next, where
    ``logsumexp`` is six (max, subtract, exp, sum, log, add), each costing more than its work in
    a hook that runs after the model's own kernels (on the benchmark GPT, about 130 against 160
    us a step). Exact to float32 rounding of ``log Z - max(x)``, which lies in ``[0, log V]``; a
    row's ``-inf`` logits (a masked vocabulary) do not reach either max.
    """
    x = _detached(logits)
    while x.dim() > 2:
        x = x[0]
    x = x if x.dtype is torch.float32 else x.float()
    lse = torch.amax(x, dim=-1) - torch.amax(torch.log_softmax(x, dim=-1), dim=-1)
    if out is not None and out.dtype is torch.float32:
        return torch.mean(lse, dim=tuple(range(lse.dim())), out=out)
    return lse.mean()


def stacked_norms(tensors: list[torch.Tensor], ord: float, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``ord``-norms of ``tensors`` as one float32 vector: one ``_foreach_norm`` (per dtype
    class when half precision or float64 tensors are mixed in) and one stack, into ``out``
    (any float32 tensor of ``len(tensors)`` elements) when given."""
    if all(t.dtype is torch.float32 for t in tensors):
        same = torch._foreach_norm(tensors, ord)
        if out is not None and out.is_contiguous() and out.dtype is torch.float32:
            return torch.stack(same, out=out.view(-1))
        stacked = torch.stack(same)
        return stacked if out is None else out.copy_(stacked.view(out.shape))
    dest = out
    norms: list[Optional[torch.Tensor]] = [None] * len(tensors)
    wide = [i for i, t in enumerate(tensors) if t.dtype is torch.float64]
    narrow = [i for i, t in enumerate(tensors) if t.dtype is not torch.float64]
    if narrow:
        for i, n in zip(narrow, torch._foreach_norm([tensors[i] for i in narrow], ord, dtype=torch.float32)):
            norms[i] = n
    if wide:
        for i, n in zip(wide, torch._foreach_norm([tensors[i] for i in wide], ord)):
            norms[i] = n.float()
    stacked = torch.stack([n for n in norms if n is not None])
    return stacked if dest is None else dest.copy_(stacked.view(dest.shape))

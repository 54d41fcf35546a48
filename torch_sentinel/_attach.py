"""``attach()``: validate what the user passed, then build the :class:`~torch_sentinel._api.Sentinel`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from torch import nn

from ._api import Sentinel
from ._collect.model_map import unwrap_model
from ._errors import format_message
from ._lifecycle import attached_to, register
from ._options import Options
from ._unwrap import unwrap_optimizer

__all__ = ["OptimizerArg", "attach"]

OptimizerArg = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], None]


def _as_optimizers(optimizer: OptimizerArg) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [unwrap_optimizer(optimizer)]
    if isinstance(optimizer, (list, tuple)) and all(isinstance(o, torch.optim.Optimizer) for o in optimizer):
        return [unwrap_optimizer(o) for o in optimizer]
    got = type(optimizer).__name__
    if isinstance(optimizer, (list, tuple)):
        got = "a sequence containing " + ", ".join(sorted({type(o).__name__ for o in optimizer}))
    raise TypeError(
        format_message(
            "attach() expected a torch.optim.Optimizer, a list of them, or None as optimizer",
            arrived=got,
            next_check="pass the optimizer object itself (not its class, a scheduler, or its state_dict)",
        )
    )


def attach(
    model: nn.Module,
    optimizer: OptimizerArg = None,
    *,
    log_dir: Optional[str] = None,
    check: str = "auto",
    flush_every: int = 10,
    on_nonfinite: str = "raise",
    **options: Any,
) -> Sentinel:
    """Instrument ``model`` (and ``optimizer``) in one line; the training loop stays as it is.

    On a model that is already attached (after replacing a submodule, to watch the new
    parameters too), the sentinel attached before is detached and the new one goes on from it:
    the same step numbering (unless ``start_step`` is given) and its findings, which are not
    reported again. The old sentinel's ``report()`` still answers.

    Args:
        model: any ``nn.Module``, also wrapped in DDP or ``torch.compile``.
        optimizer: a ``torch.optim.Optimizer``, a list of them, or None (forward-only checks).
        log_dir: where TensorBoard event files, ``findings.jsonl`` and ``manifest.json`` go.
        check: ``"immediate"`` checks inside each hook and raises there; ``"deferred"`` moves
            flags to the host asynchronously and raises at the next hook or step call, naming
            the exact step; ``"auto"`` is immediate on CPU and deferred on accelerators.
        flush_every: steps between detector runs and log writes.
        on_nonfinite: ``"raise"``, ``"warn"`` or ``"record"``; ``$TORCH_SENTINEL_ON_NONFINITE``
            overrides it.
        **options: see :class:`torch_sentinel._options.Options` (``seed``, ``log_every``,
            ``disable``, ``thresholds``, ``update_every``, ...).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            format_message(
                "attach() expected an nn.Module as model",
                arrived=f"{type(model).__module__}.{type(model).__qualname__}",
                next_check="pass the model instance, e.g. attach(model, optimizer)",
            )
        )
    optimizers = _as_optimizers(optimizer)
    root = unwrap_model(model)
    previous = attached_to(root)
    if previous is not None and not previous.attached:
        previous = None
    if previous is not None and "start_step" not in options:
        options["start_step"] = previous.step  # the run goes on: its step numbers too
    opts = Options.build(
        log_dir=log_dir, check=check, flush_every=flush_every, on_nonfinite=on_nonfinite, **options
    )
    if previous is not None:
        # Attaching again (after replacing a submodule, or a notebook cell run twice) replaces
        # the sentinel in place: the one attached before is closed as detach() closes it (its
        # report() still answers), and the new one carries its findings on.
        previous.detach()
    model_params = {id(p) for p in root.parameters()}
    for i, opt in enumerate(optimizers):
        held = [p for g in opt.param_groups for p in g["params"]]
        if held and not any(id(p) in model_params for p in held):
            warnings.warn(
                f"optimizer {i} ({type(opt).__name__}) holds none of the model's parameters: "
                "was it built for another model, or before the model was replaced?",
                UserWarning,
                stacklevel=2,
            )
    sentinel = Sentinel(model, optimizers, opts)
    if previous is not None:
        sentinel.continue_from(previous)
    register(root, sentinel, sentinel.close_unattended)
    return sentinel

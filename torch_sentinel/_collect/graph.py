"""The leaves of an autograd graph, found on the host by walking ``grad_fn.next_functions``.

Used (rarely) to find tensors that receive gradients from the model's backward but are not
registered anywhere: parameters of submodules kept in a plain Python list, or raw tensors
with ``requires_grad``. Pure Python over the graph's nodes: no device op, no read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["graph_leaves", "locate_attribute"]

#: A bound on the walk so a huge graph costs at most a few milliseconds, once.
_MAX_NODES = 200_000


def graph_leaves(root: torch.Tensor) -> list[torch.Tensor]:
    """Leaf tensors (``AccumulateGrad`` variables) the backward from ``root`` would reach."""
    fn = root.grad_fn
    if fn is None:
        return [root] if root.requires_grad else []
    leaves: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[Any] = [fn]
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
            continue
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    return leaves


def locate_attribute(modules: list[tuple[str, nn.Module]], target: torch.Tensor) -> tuple[str, str]:
    """Where an unregistered tensor lives: (owning module's name, attribute path), found by
    looking through plain lists, tuples and dicts held in modules' ``__dict__``."""
    for mname, module in modules:
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            items: list[tuple[str, Any]]
            if isinstance(value, (list, tuple)):
                items = [(f"{attr}[{i}]", v) for i, v in enumerate(value)]
            elif isinstance(value, dict):
                items = [(f"{attr}[{k!r}]", v) for k, v in value.items()]
            else:
                items = [(attr, value)]
            for path, v in items:
                if v is target:
                    return mname, path
                if isinstance(v, nn.Module):
                    for pname, p in v.named_parameters():
                        if p is target:
                            return mname, f"{path}.{pname}"
    return "", "<unknown>"

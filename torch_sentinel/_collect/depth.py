"""Depth of each layer in the autograd graph, counted in weighted layers from the loss.

Forward execution order says little about depth: a transformer block runs its query, key and
value projections one after the other, but they sit side by side in the graph, and a residual
stream joins layers that ran far apart. The depth used for gradient scale is the *longest*
path from the loss to a layer's weight, counting only the weighted ops on it (a Linear, a
conv): parallel branches (q, k, v) get the same depth, and the first block is deepest even
when a residual connection offers a short cut. One host walk over ``grad_fn`` nodes, once per
run; no device op, no read.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["layer_depths"]

#: A bound on the walk so a huge graph costs at most a few tens of milliseconds, once.
_MAX_NODES = 200_000


def layer_depths(loss: torch.Tensor, weights: dict[int, str]) -> dict[str, int]:
    """The depth of each layer whose weight (``id(tensor) -> layer``) the loss's graph reaches.

    Args:
        loss: the scalar the backward runs from.
        weights: the layers' weight tensors by ``id``, mapped to the layer's name.
    """
    root = loss.grad_fn
    if root is None:
        return {}
    # iterative DFS for a reverse post-order (a topological order: parents before children)
    order: list[Any] = []
    seen: set[int] = {id(root)}
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack and len(seen) < _MAX_NODES:
        node, i = stack.pop()
        nxt = [f for f, _ in getattr(node, "next_functions", ()) if f is not None]
        if i < len(nxt):
            stack.append((node, i + 1))
            child = nxt[i]
            if id(child) not in seen:
                seen.add(id(child))
                stack.append((child, 0))
        else:
            order.append(node)
    order.reverse()

    def weight_of(node: Any) -> str:
        var = getattr(node, "variable", None)
        return weights.get(id(var), "") if isinstance(var, torch.Tensor) else ""

    dist: dict[int, int] = {id(root): 0}
    depths: dict[str, int] = {}
    for node in order:
        d = dist.get(id(node), 0)
        children = [f for f, _ in getattr(node, "next_functions", ()) if f is not None]
        layer = next((name for name in map(weight_of, children) if name), "")
        if not layer:
            # the weight reached through one pass-through op (Linear's t(), an autocast copy)
            for child in children:
                grand = [f for f, _ in getattr(child, "next_functions", ()) if f is not None]
                if len(grand) == 1 and weight_of(grand[0]):
                    layer = weight_of(grand[0])
                    break
        step = 1 if layer else 0  # this op applies a layer's weight
        for child in children:
            if dist.get(id(child), -1) < d + step:
                dist[id(child)] = d + step
        name = weight_of(node)
        if name:
            depths[name] = max(depths.get(name, 0), d)
    return depths

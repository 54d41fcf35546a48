"""Names for what the user owns: modules and parameters, relative to the attached model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn

__all__ = ["ModelMap", "post_order", "trainable_params", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose names users know: without DDP's ``module.`` or compile's ``_orig_mod.``."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, nn.Module):
            model = inner
            continue
        if isinstance(model, nn.parallel.DistributedDataParallel) or type(model).__name__ in (
            "DataParallel",
            "DistributedDataParallel",
        ):
            inner_module = model.module
            assert isinstance(inner_module, nn.Module)
            model = inner_module
            continue
        break
    return model


class ModelMap:
    """Qualified names of modules and parameters, and which module owns each parameter."""

    def __init__(self, model: nn.Module) -> None:
        self.root = unwrap_model(model)
        self.module_names: dict[int, str] = {}
        self.modules: list[tuple[str, nn.Module]] = []
        for name, module in self.root.named_modules(remove_duplicate=True):
            self.module_names[id(module)] = name
            self.modules.append((name, module))
        self.params: list[tuple[str, nn.Parameter]] = []
        self.param_owner: dict[str, str] = {}
        self.param_names: dict[int, str] = {}
        for mname, module in self.modules:
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in self.param_names:
                    continue  # tied weights: first owner wins
                qual = f"{mname}.{pname}" if mname else pname
                self.params.append((qual, p))
                self.param_names[id(p)] = qual
                self.param_owner[qual] = mname

    def device(self) -> torch.device:
        """Where the model lives: its first non-meta parameter's device, else its first buffer's."""
        for _, p in self.params:
            if p.device.type != "meta":
                return p.device
        for _, b in self.root.named_buffers():
            return b.device
        return torch.device("cpu")

    def name_of(self, module: nn.Module) -> Optional[str]:
        return self.module_names.get(id(module))

    def param_name(self, p: torch.Tensor) -> Optional[str]:
        return self.param_names.get(id(p))

    def type_of(self, module_name: Optional[str]) -> str:
        if module_name is None:
            return ""
        for name, module in self.modules:
            if name == module_name:
                return type(module).__name__
        return ""

    def display(self, module_name: Optional[str]) -> str:
        """A module name as shown to users: the root is ``<model>``."""
        if module_name is None:
            return "<none>"
        return module_name or "<model>"


def trainable_params(model_map: ModelMap, optimizers: Sequence[torch.optim.Optimizer]) -> list[tuple[str, torch.Tensor]]:
    """Model parameters plus any optimizer parameter that is not in the model."""
    params: list[tuple[str, torch.Tensor]] = list(model_map.params)
    seen = {id(p) for _, p in params}
    for oi, opt in enumerate(optimizers):
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append((f"<optimizer{oi}>.param_groups[{gi}][{pi}]", p))
    return params


def post_order(names: list[str]) -> list[int]:
    """Indices of ``names`` (qualified module names in ``named_modules`` pre-order) in post-order."""
    out: list[int] = []
    open_: list[int] = []
    for i, name in enumerate(names):
        while open_ and not (names[open_[-1]] == "" or name.startswith(names[open_[-1]] + ".")):
            out.append(open_.pop())
        open_.append(i)
    out.extend(reversed(open_))
    return out

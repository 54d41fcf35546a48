"""Submodules replaced after ``attach()``: watched again at the model's next forward.

``model.head = nn.Linear(...)`` after ``attach()`` puts a module without the sentinel's hooks
where the old one was: a NaN it makes would be charged to whatever watched module sees it next
(the model itself). torch calls a process-wide hook whenever a submodule is assigned
(``register_module_module_registration_hook``), so a replacement is seen when it happens, with
no walk over the model's modules per step; the collector records the path (:meth:`note`) and,
at the model's next forward, :meth:`Replacements.rebind` moves each replaced module's slot to
the new module: its outputs and output gradients are watched again under the same name.

Not re-instrumented (one warning says so): the new module's parameters (the norms and updates
are those of the parameters ``attach()`` saw), hooks other probes put on the old module, and
submodules with names that did not exist at attach (a NaN there is charged to the nearest
watched module above them). Attaching again after replacing modules watches everything.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from torch import nn

from .model_map import ModelMap

__all__ = ["Replacements"]

logger = logging.getLogger("torch_sentinel")

_MAX_REBINDS = 3


class Replacements:
    """Tracks submodule assignments inside the attached model and rebinds their slots.

    Args:
        model_map: the attached model's names; its ``modules`` and ``module_names`` are updated.
        rehook: called with the slot of each moved module: its forward hook moves to the new module.
        on_rebind: called with ``(name, old, new)`` for each module moved to a new object.
    """

    def __init__(self, model_map: ModelMap, rehook: Callable[[int], None],
                 on_rebind: Callable[[str, nn.Module, nn.Module], None]) -> None:
        self._map = model_map
        self._rehook = rehook
        self._on_rebind = on_rebind
        #: Qualified names assigned since the last rebind (empty on almost every step).
        self.pending: list[str] = []
        self._warned: set[str] = set()
        #: Rebinds per path: a module that assigns a fresh submodule in every forward is
        #: rebound a few times, then left alone (its hooks would pile up otherwise).
        self._count: dict[str, int] = {}

    def note(self, parent: nn.Module, name: str, module: nn.Module) -> Optional[nn.Module]:
        """torch's registration hook: ``parent.name = module`` is about to happen."""
        path = self._map.name_of(parent)
        if path is not None:
            self.pending.append(f"{path}.{name}" if path else name)
        return None  # keep the module the user assigned

    def rebind(self, step: int) -> None:
        """Move the slots of replaced modules to the modules now at their paths (at the
        model's next forward, host side only)."""
        paths, self.pending = sorted(set(self.pending)), []
        root, modules = self._map.root, self._map.modules
        for path in paths:
            self._count[path] = self._count.get(path, 0) + 1
            if self._count[path] > _MAX_REBINDS:
                continue
            within = [i for i, (n, _) in enumerate(modules) if n == path or n.startswith(path + ".")]
            if not within:
                continue  # a new name: inside a watched module, charged to it
            for i in within:
                name, old = modules[i]
                try:
                    new = root.get_submodule(name)
                except AttributeError:
                    continue  # removed: its slot just stays empty
                if new is old:
                    continue
                modules[i] = (name, new)
                self._map.module_names.pop(id(old), None)
                self._map.module_names[id(new)] = name
                self._rehook(i)
                self._on_rebind(name, old, new)
            self._warn(path, step)

    def _warn(self, path: str, step: int) -> None:
        if path in self._warned:
            return
        self._warned.add(path)
        try:
            module = self._map.root.get_submodule(path)
        except AttributeError:
            return
        known = {n for n, _ in self._map.modules}
        new_names = [n for n, _ in module.named_modules(prefix=path) if n not in known]
        unwatched = f"; submodules new since attach are charged to it: {', '.join(new_names[:5])}" if new_names else ""
        logger.warning(
            "torch_sentinel: submodule %r (%s) was replaced after attach(); its outputs and output "
            "gradients are watched again from step %d under the same name. Not watched: the norms "
            "and updates of its new parameters%s. Attach again after replacing modules to watch everything.",
            path, type(module).__name__, step, unwatched,
        )

"""``optimizer.step(closure)``: record the step once, after the closure's first evaluation.

Lightning and LBFGS run forward and backward inside ``step()``: the gradients exist only once
the closure returned, so the pre-update records are taken there. LBFGS evaluates the closure
again during its line search; the step's loss is what ``step()`` returns (the first evaluation),
so later evaluations are neither counted nor recorded (:attr:`ClosureSteps.tail`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["ClosureSteps"]


class ClosureSteps:
    def __init__(self, before_update: Callable[[Any], None]) -> None:
        self._before_update = before_update
        #: Inside step(closure), after the closure's first evaluation.
        self.tail = False

    def wrap(self, optimizer: Any, args: Any, kwargs: Any) -> Optional[tuple[Any, Any]]:
        """The step's (args, kwargs) with the closure wrapped, or None when there is none."""
        closure = kwargs.get("closure") if kwargs else None
        in_kwargs = closure is not None
        # The hook's args start with the optimizer itself (torch passes step()'s own args).
        at = 1 if args and args[0] is optimizer else 0
        if closure is None and len(args) > at and callable(args[at]):
            closure = args[at]
        if closure is None:
            return None

        def recorded_closure() -> Any:
            if self.tail:
                return closure()  # a line-search evaluation (LBFGS): not this step's loss
            result = closure()
            self._before_update(optimizer)
            self.tail = True
            return result

        if in_kwargs:
            return args, {**kwargs, "closure": recorded_closure}
        return (*args[:at], recorded_closure, *args[at + 1 :]), kwargs

    def end(self) -> None:
        self.tail = False

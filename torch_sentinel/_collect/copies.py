"""Copies of an attached model carry nothing of the sentinel.

A module keeps its hooks in dicts of its own (``_forward_hooks``, ``_forward_pre_hooks``, ...),
so ``copy.deepcopy(model)`` (EMA copies, ``swa_utils.AveragedModel``, best-model snapshots),
``pickle`` and ``torch.save(model)`` copy every entry, the sentinel's included: a copy would
drag the sentinel along (and be watched by it), and a saved file would not load where
torch_sentinel is not installed.

torch copies and pickles a module through ``__reduce_ex__``, whose state is what
``__getstate__`` returns: a fresh copy of the module's ``__dict__``. While a sentinel is
attached, ``nn.Module.__reduce_ex__`` is wrapped (one shared :class:`~.patches.Patch`, removed
at detach) and the sentinel's entries are taken out of that state
(:func:`~.compat.drop_hooks_from_state`): the copy, or the file, holds the user's hooks and
nothing else, and the live model keeps its own.

Where the state cannot be edited (a module class with its own ``__reduce_ex__``, or a
``__getstate__`` that returns the live ``__dict__``), the entry reduces by itself to an inert
hook that is no torch_sentinel object (see :class:`~.hookset.ModuleHook`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .compat import drop_hooks_from_state
from .hookset import HookSet, ModuleHook
from .patches import patch_for

__all__ = ["leave_hooks_out_of_copies"]


def leave_hooks_out_of_copies(hooks: HookSet) -> None:
    """Until ``hooks`` closes, copies and pickles of any module leave out the sentinels' hooks."""
    hooks.subscribe(patch_for(nn.Module, "__reduce_ex__"), _LeaveOut())


def _ours(hook: Any) -> bool:
    return isinstance(hook, ModuleHook)


class _LeaveOut:
    """Edits the state that ``nn.Module.__reduce_ex__`` returned; the call itself is untouched."""

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    def after(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        if not args or not isinstance(result, tuple) or len(result) < 3:
            return  # raised, or a class's own reduction without a state
        state = result[2]
        # Only a state made for this call: never the live module's own __dict__.
        if isinstance(state, dict) and state is not getattr(args[0], "__dict__", None):
            drop_hooks_from_state(state, _ours)

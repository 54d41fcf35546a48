"""One owner for every RemovableHandle and patch subscription, so detach() undoes all of them."""

from __future__ import annotations

from torch.utils.hooks import RemovableHandle

from .patches import Patch, PatchListener

__all__ = ["HookSet"]


class HookSet:
    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._patches: list[tuple[Patch, PatchListener]] = []

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        self._handles.append(handle)
        return handle

    def subscribe(self, patch: Patch, listener: PatchListener) -> None:
        patch.add(listener)
        self._patches.append((patch, listener))

    def ensure_patches(self) -> int:
        """Re-install any of our patches that another library removed; how many it had to."""
        seen: set[int] = set()
        fixed = 0
        for patch, _ in self._patches:
            if id(patch) not in seen:
                seen.add(id(patch))
                fixed += patch.ensure()
        return fixed

    def __len__(self) -> int:
        return len(self._handles) + len(self._patches)

    def close(self) -> None:
        """Remove everything, newest first; one failure does not stop the rest."""
        errors: list[BaseException] = []
        while self._handles:
            handle = self._handles.pop()
            try:
                handle.remove()
            except Exception as exc:  # pragma: no cover - defensive
                errors.append(exc)
        while self._patches:
            patch, listener = self._patches.pop()
            try:
                patch.remove(listener)
            except Exception as exc:  # pragma: no cover - defensive
                errors.append(exc)
        if errors:
            raise errors[0]



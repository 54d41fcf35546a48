"""``shared_module``: one module instance registered under several names.

``[Block()] * 3`` (list multiplication repeats one instance), ``ModuleList([mlp] * n)``, or one
attribute assigned to two slots: the model then has one set of weights where it appears to have
several, and every "layer" updates the same tensors. Nothing fails; the model silently has a
fraction of the parameters its definition suggests. ``named_modules()`` hides it (it drops
duplicates, and so does the sentinel's own map of the model), so the check walks
``named_modules(remove_duplicate=False)`` once, at ``attach()``, and reports every instance with
parameters that is registered under more than one name, naming every name (an instance nested
inside a shared one is reported through its outermost shared ancestor). Weight tying, one
parameter shared by two *different* modules (tied input and output embeddings), is not this.

Sharing on purpose (ALBERT's cross-layer sharing, a Siamese tower written as one module used
twice under two names) opts out with ``attach(disable={"shared_module"})``.

The rung is ``shapes``: like a shape contract, it is a fault in how the model is built, found
before any step, and it comes before any evidence from the forward pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn

from .._collect.probe import Probe, ProbeHost
from .._findings import Finding
from .base import Detector

__all__ = ["ModuleStructure", "SharedModuleDetector"]


class ModuleStructure(Probe):
    """What the model's structure says at ``attach()``: module instances registered under
    several names, and embedding rows that get no gradient by construction (``padding_idx``).
    Read once in ``setup``; no event."""

    name = "module_structure"

    def __init__(self) -> None:
        #: (every name, type, parameter count) of each outermost shared instance with parameters
        self.shared: list[tuple[list[str], str, int]] = []
        #: (module name, parameter name, padding row) of each embedding with a padding_idx
        self.padding_rows: list[tuple[str, str, int]] = []

    def setup(self, host: ProbeHost) -> None:
        root = host.map.root
        names: dict[int, list[str]] = {}
        modules: dict[int, nn.Module] = {}
        for name, module in root.named_modules(remove_duplicate=False):
            names.setdefault(id(module), []).append(name)
            modules[id(module)] = module
        shared = [(ns, modules[i]) for i, ns in names.items()
                  if len(ns) > 1 and any(True for _ in modules[i].parameters())]
        outer: list[tuple[list[str], str, int]] = []
        for ns, module in shared:
            # nested inside another shared instance: its names are that one's names plus a suffix
            if any(o is not module and any(n.startswith(p + ".") for n in ns for p in other)
                   for other, o in shared):
                continue
            outer.append((ns, type(module).__name__, sum(p.numel() for p in module.parameters())))
        self.shared = outer
        first = {i: ns[0] for i, ns in names.items()}
        self.padding_rows = [
            (first[id(m)], f"{first[id(m)]}.weight" if first[id(m)] else "weight", int(m.padding_idx))
            for m in modules.values()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.padding_idx is not None
        ]


class SharedModuleDetector(Detector):
    kind = "shared_module"
    rung = "shapes"
    next_check = "give_each_use_its_own_module"
    hypothesis = "one module instance is used where several independent ones were meant"

    def __init__(self) -> None:
        self.structure = ModuleStructure()

    def probes(self) -> Sequence[Probe]:
        return (self.structure,)

    def setup(self) -> None:
        self._reported = False

    def conclude(self, final: bool = False) -> Iterable[Finding]:
        if self._reported:
            return []
        self._reported = True
        return [self._finding(names, mtype, count) for names, mtype, count in self.structure.shared]

    def _finding(self, names: list[str], mtype: str, count: int) -> Finding:
        shown = ", ".join(repr(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        return self.finding(
            f"one {mtype} instance ({count} parameters) is registered under {len(names)} names: {shown}. "
            f"They are the same module with the same weights, so the model has {len(names) - 1} "
            f"fewer copies of it than its definition suggests (list multiplication such as "
            f"[{mtype}()] * {len(names)}, or one module assigned to several attributes?). Build a new "
            "instance for each use; if the sharing is deliberate, attach with "
            "disable={'shared_module'}",
            module=names[0], step=0, severity="warning",
            evidence={"names": names[:16], "module_type": mtype, "parameters": count, "uses": len(names)},
        )


def padding_row_findings(detector: Detector, structure: ModuleStructure) -> list[Finding]:
    """Info findings for embedding rows that get no gradient by construction (``padding_idx``),
    given as ``detector``'s. Each names the parameter (``emb.weight``), not its module: a finding
    about the whole module (its weight cut off from the loss) must not be taken for this one."""
    return [detector.finding(
        f"row {row} of {param} gets no gradient by construction: {module or '<model>'} is an embedding "
        f"with padding_idx={row}, whose row stays at its initial value (zeros by default). Not a fault",
        module=param, step=0, severity="info", next_check="continue_training_or_collect_more_evidence",
        evidence={"parameter": param, "row": row, "reason": "padding_idx"},
    ) for module, param, row in structure.padding_rows]

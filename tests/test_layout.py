"""The package's layout, read from its source with ``ast``: no import cycles (type-only imports
under ``if TYPE_CHECKING:`` and imports inside functions count), no module over 400 lines, and
no reaching into another object's private members. Each allowlist entry says why it is still
there; the lists only shrink."""

from __future__ import annotations

import ast
import pathlib
from typing import Union

import torch_sentinel

PACKAGE = pathlib.Path(torch_sentinel.__file__).parent
#: namedtuple's own API: public methods with an underscore so that they never clash with a field.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}

MAX_LINES = 400

#: Modules over MAX_LINES lines.
LONG_MODULES_ALLOWED: set[str] = set()

#: Import cycles (each a set of modules, as the strongly connected component they form).
CYCLES_ALLOWED: set[frozenset[str]] = set()

#: (module path, expression) pairs that still read another object's private member.
PRIVATE_ACCESS_ALLOWED = {
    # issue 22: Patch._drop called from the wrapper closure that Patch._make_wrapper builds (its own class)
    ("_collect/patches.py", "patch._drop"),
    # torch's own accessor for a coalesced sparse tensor's values, behind one wrapper
    ("_collect/compat.py", "grad.coalesce()._values"),
    # issue 22: the aten ops a host read dispatches to: what count_host_syncs counts, by name
    ("testing.py", "_aten._local_scalar_dense"),
    ("testing.py", "_aten._unique2"),
    # issue 25: the dim a log_softmax/softmax autograd node saved: torch's documented accessor for
    # what a node saved (the autograd notes' "saved tensors": grad_fn._saved_<name>)
    ("losses/calls.py", "saved._saved_dim"),
}


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: pathlib.Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _imported_modules(tree: ast.Module) -> set[str]:
    """Names bound to imported modules (``torch``, ``nn``, ``sys``): their private members are
    the library's, reached through its module, not another object's."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.nn", "torch.utils"):
            names.update(a.asname or a.name for a in node.names)
    return names


def _private_accesses(path: pathlib.Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = _imported_modules(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if node.attr in NAMEDTUPLE_API:
            continue
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if isinstance(root, ast.Name) and root.id in modules:
            continue
        found.add((_name(path), ast.unparse(node)))
    return found


def test_no_module_reaches_into_another_objects_private_members() -> None:
    found = set().union(*(_private_accesses(p) for p in _modules()))
    assert sorted(found - PRIVATE_ACCESS_ALLOWED) == []
    assert sorted(PRIVATE_ACCESS_ALLOWED - found) == [], "fixed: take it off the allowlist"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (module level, under
    ``if TYPE_CHECKING:``, inside functions). ``from pkg import name`` names the submodule when
    ``name`` is one, else the package."""
    this = _module_name(path)
    package = this.split(".") if path.name == "__init__.py" else this.split(".")[:-1]
    package = [p for p in package if p]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name.removeprefix(PACKAGE.name).lstrip(".") for a in node.names
                       if a.name == PACKAGE.name or a.name.startswith(PACKAGE.name + ".")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == PACKAGE.name or node.module.startswith(PACKAGE.name + ".")):
                module = node.module.removeprefix(PACKAGE.name).lstrip(".")
            else:
                continue
            targets = [f"{module}.{a.name}".lstrip(".") if f"{module}.{a.name}".lstrip(".") in known else module
                       for a in node.names]
        found.update(t for t in targets if t in known and t != this)
    return found


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Union[list[str], None]]] = [(start, None)]
        while work:
            node, pending = work.pop()
            if pending is None:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
                pending = sorted(graph[node])
            advanced = False
            while pending:
                nxt = pending.pop()
                if nxt not in index:
                    work.append((node, pending))
                    work.append((nxt, None))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles() -> None:
    paths = _modules()
    known = {_module_name(p) for p in paths}
    graph = {_module_name(p): _imports(p, known) for p in paths}
    assert any(graph.values())  # the imports were read
    cycles = _cycles(graph)
    assert sorted(map(sorted, cycles - CYCLES_ALLOWED)) == []
    assert sorted(map(sorted, CYCLES_ALLOWED - cycles)) == [], "broken: take it off the allowlist"


def test_no_module_is_over_400_lines() -> None:
    long = {_name(p) for p in _modules() if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert sorted(long - LONG_MODULES_ALLOWED) == []
    assert sorted(LONG_MODULES_ALLOWED - long) == [], "now short enough: take it off the allowlist"


def test_the_cycle_finder_finds_a_type_only_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset({"a", "b", "c"})}
    assert _cycles({"a": {"b"}, "b": set()}) == set()

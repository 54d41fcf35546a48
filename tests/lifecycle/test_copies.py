"""Copies of an attached model carry no torch_sentinel object: ``copy.deepcopy``, ``pickle`` and
``torch.save`` leave the sentinel's hook entries out (the user's own hooks stay), the saved file
loads and trains in an interpreter where torch_sentinel cannot be imported, and the attached
model keeps every hook. Where a module's state cannot be edited, the entry becomes a builtin
no-op, never one of our objects."""

from __future__ import annotations

import copy
import functools
import gc
import io
import json
import pathlib
import pickle
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import torch_sentinel
from torch_sentinel._collect.hookset import ModuleHook

USER_MODULE = '''
import torch
from torch import nn


def user_hook(module, args, output):
    """A hook of the user's own: copies keep it."""
    return None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.rnn = nn.LSTM(8, 8, batch_first=True)  # RNNBase reduces with its own __getstate__
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h, _ = self.rnn(self.fc(x))
        return self.head(self.act(h[:, -1]))
'''

LOAD_WITHOUT_TORCH_SENTINEL = '''
import json, pickle, sys
sys.modules["torch_sentinel"] = None  # `import torch_sentinel` raises ImportError from here on
sys.path.insert(0, sys.argv[1])
import torch
import usermodel

with open(sys.argv[2], "rb") as f:
    model = torch.load(f, weights_only=False) if sys.argv[3] == "torch-save" else pickle.load(f)
model(torch.randn(3, 5, 6)).sum().backward()
hooks = {}
for name, m in model.named_modules():
    for attr, d in vars(m).items():
        if "hook" in attr and isinstance(d, dict) and d:
            hooks[f"{name}.{attr}"] = sorted(getattr(h, "__qualname__", repr(h)) for h in d.values())
print(json.dumps({
    "hooks": hooks,
    "grads": all(p.grad is not None for p in model.parameters()),
    "loaded": sorted(k for k in sys.modules if k.startswith("torch_sentinel") and sys.modules[k] is not None),
}))
'''


@pytest.fixture
def usermodel(tmp_path: pathlib.Path) -> Iterator[types.ModuleType]:
    (tmp_path / "usermodel.py").write_text(USER_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import usermodel as module

        yield module
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("usermodel", None)


def _attached(usermodel: types.ModuleType) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = usermodel.Net()
    model.fc.register_forward_hook(usermodel.user_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sentinel = torch_sentinel.attach(model, opt, check="deferred")  # every module hooked
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 5, 6)).sum().backward()
        opt.step()
    return model, opt, sentinel


def _ours(model: nn.Module) -> int:
    return sum(isinstance(h, ModuleHook) for m in model.modules() for d in vars(m).values()
               if isinstance(d, dict) for h in d.values())


def _hook_entries(model: nn.Module) -> dict[str, Any]:
    """Every non-empty hook dict and hook flag dict, by module and attribute."""
    return {f"{name}.{attr}": list(d.items()) for name, m in model.named_modules()
            for attr, d in vars(m).items() if "hook" in attr and isinstance(d, dict) and d}


def _sentinel_objects(root: Any) -> list[str]:
    """Objects of torch_sentinel reachable from ``root`` (classes, modules and the globals of
    functions are not followed: they lead to everything)."""
    seen: set[int] = set()
    found: list[str] = []
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        owner = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
        if isinstance(owner, str) and owner.startswith("torch_sentinel"):
            found.append(repr(obj)[:80])
        if isinstance(obj, types.FunctionType):
            continue
        todo.extend(gc.get_referents(obj))
    return found


def _copy(model: nn.Module, how: str) -> nn.Module:
    if how == "deepcopy":
        return copy.deepcopy(model)
    if how == "averaged-model":
        return torch.optim.swa_utils.AveragedModel(model).module
    if how == "pickle":
        return pickle.loads(pickle.dumps(model))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


HOW = ["deepcopy", "averaged-model", "pickle", "torch-save"]


@pytest.mark.parametrize("how", HOW, ids=HOW)
def test_a_copy_keeps_the_users_hooks_and_nothing_of_ours(how: str, usermodel: types.ModuleType) -> None:
    model, opt, sentinel = _attached(usermodel)
    with sentinel:
        ours = _ours(model)
        assert ours > 10
        copied = _copy(model, how)
        assert _ours(model) == ours  # the attached model keeps every hook
        assert _hook_entries(copied) == {"fc._forward_hooks": [(k, usermodel.user_hook) for k, _ in
                                                               _hook_entries(copied)["fc._forward_hooks"]]}
        assert _sentinel_objects(copied) == []
        assert b"torch_sentinel" not in pickle.dumps(copied)
        # the copy trains; the original is still watched
        copied(torch.randn(3, 5, 6)).sum().backward()
        opt.zero_grad()
        model(torch.randn(3, 5, 6)).sum().backward()
        opt.step()
        assert sentinel.step == 3


@pytest.mark.parametrize("how", ["torch-save", "pickle"], ids=["torch-save", "pickle"])
def test_a_saved_model_loads_and_trains_where_torch_sentinel_cannot_be_imported(
    how: str, usermodel: types.ModuleType, tmp_path: pathlib.Path
) -> None:
    model, _, sentinel = _attached(usermodel)
    path = tmp_path / "model.pt"
    with sentinel, open(path, "wb") as f:
        if how == "torch-save":
            torch.save(model, f)
        else:
            pickle.dump(model, f)
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(LOAD_WITHOUT_TORCH_SENTINEL))
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(path), how],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"hooks": {"fc._forward_hooks": ["user_hook"]}, "grads": True, "loaded": []}


def test_a_compiled_deep_copy_trains_like_the_eager_copy(usermodel: types.ModuleType) -> None:
    model, _, sentinel = _attached(usermodel)
    with sentinel:
        copied = copy.deepcopy(model)
        compiled = torch.compile(copy.deepcopy(model), backend="aot_eager")
        x = torch.randn(3, 5, 6)
        eager_out, compiled_out = copied(x), compiled(x)
        eager_out.sum().backward()
        compiled_out.sum().backward()
        assert torch.allclose(eager_out, compiled_out)
        for p, q in zip(copied.parameters(), compiled.parameters()):
            assert torch.allclose(p.grad, q.grad)


class LiveState(nn.Linear):
    """A module whose ``__getstate__`` hands out its live ``__dict__``: the state cannot be
    edited, so the sentinel's entries stay, as inert builtins."""

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__


@pytest.mark.parametrize("how", ["deepcopy", "pickle"], ids=["deepcopy", "pickle"])
def test_an_entry_that_cannot_be_left_out_is_a_builtin_no_op(how: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(LiveState(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    with torch_sentinel.attach(model, check="deferred"):
        copied = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
        inert = [h for d in vars(copied[0]).values() if isinstance(d, dict) for h in d.values()
                 if isinstance(h, functools.partial)]
        assert inert and all(type(h) is functools.partial and h.func is sys.audit for h in inert)
        assert all(h(copied[0], (x,), x) is None for h in inert)
        assert _sentinel_objects(copied) == []
        assert torch.equal(copied(x), model(x))

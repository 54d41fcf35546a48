"""Where contracts are checked: ``expect(module, input=..., output=...)`` hooks a module, and
``@expect(x=..., returns=...)`` wraps a function. The contract grammar is ``contracts.py``."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from typing import Any, Callable, Optional, TypeVar

import torch
from torch import nn

from .._collect.hookset import HookSet
from .._errors import ShapeContractError, format_message
from .contracts import Contract, Spec

__all__ = ["ContractHandle", "expect"]

F = TypeVar("F", bound=Callable[..., Any])


def _as_mapping(spec: Optional[Spec], what: str) -> dict[str, str]:
    if spec is None:
        return {}
    if isinstance(spec, str):
        return {f"{what}[0]": spec}
    if isinstance(spec, Mapping):
        return {str(k): v for k, v in spec.items()}
    return {f"{what}[{i}]": s for i, s in enumerate(spec)}


def _outputs(output: Any) -> dict[str, Any]:
    if isinstance(output, torch.Tensor):
        return {"output[0]": output}
    if isinstance(output, Mapping):
        return {str(k): v for k, v in output.items()}
    if isinstance(output, (list, tuple)):
        return {f"output[{i}]": v for i, v in enumerate(output)}
    return {"output[0]": output}


def _pick(values: Mapping[str, Any], key: str, contract: Contract) -> Any:
    if key not in values:
        raise ShapeContractError(format_message(
            f"shape contract of {contract.where}: {key} is missing from the call",
            expected=f"{key} (named in the contract)",
            arrived="the call's values: " + (", ".join(values) or "none"),
            where=f"{contract.where} ({contract.describe()})",
            next_check="name inputs args[i] (positional), by keyword, or output[i]",
        ))
    return values[key]


class ContractHandle:
    """Returned by ``expect(module, ...)``; :meth:`remove` takes the contract off again."""

    def __init__(self, contract: Contract, hooks: HookSet) -> None:
        self.contract = contract
        self._hooks = hooks

    def remove(self) -> None:
        self._hooks.close()

    def __enter__(self) -> ContractHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _ModuleContract:
    """The forward hooks that hold a module to its contract. Bindings made on the inputs are
    kept for the same call's outputs (a stack, so recursive calls stay separate)."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self._stack: list[dict[str, tuple[int, str]]] = []

    def before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        values = {f"input[{i}]": a for i, a in enumerate(args)}
        values.update(kwargs)
        bound: dict[str, tuple[int, str]] = {}
        self._stack.append(bound)
        c = self.contract
        for key, spec in c.inputs.items():
            c.check(key, _pick(values, key, c), spec, bound)

    def after(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self._stack:
            return
        bound = self._stack.pop()
        if output is None and sys.exc_info()[1] is not None:
            return  # the forward raised; its own error is the one to see
        values = _outputs(output)
        c = self.contract
        for key, spec in c.outputs.items():
            c.check(key, _pick(values, key, c), spec, bound)


def _module_contract(module: nn.Module, where: str, input: Optional[Spec], output: Optional[Spec]) -> ContractHandle:
    contract = Contract(where, _as_mapping(input, "input"), _as_mapping(output, "output"))
    mc = _ModuleContract(contract)
    hooks = HookSet()
    hooks.add(module.register_forward_pre_hook(mc.before, with_kwargs=True))
    # always_call: a forward that raises must still pop its bindings off the stack.
    hooks.add(module.register_forward_hook(mc.after, with_kwargs=True, always_call=True))
    return ContractHandle(contract, hooks)


def _function_contract(fn: F, specs: Mapping[str, str], input: Optional[Spec], output: Optional[str]) -> F:
    sig = inspect.signature(fn)
    out_keys = {"returns", "output"}
    inputs = {k: v for k, v in specs.items() if k not in out_keys}
    names = list(sig.parameters)
    if isinstance(input, str):
        inputs[names[0] if names else "input[0]"] = input
    elif isinstance(input, Mapping):
        inputs.update(input)
    elif input is not None:
        inputs.update({names[i] if i < len(names) else f"input[{i}]": s for i, s in enumerate(input)})
    if output is not None:
        if not isinstance(output, str):
            raise TypeError("expect(function, output=...) takes one spec for the returned tensor")
        specs = {**specs, "returns": output}
    unknown = sorted(set(inputs) - set(sig.parameters))
    if unknown:
        raise TypeError(
            f"expect(): {', '.join(unknown)} are not parameters of {fn.__qualname__}{sig}"
        )
    returns = [v for k, v in specs.items() if k in out_keys]
    outputs = {"output[0]": returns[-1]} if returns else {}
    contract = Contract(fn.__qualname__, inputs, outputs)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound_args = sig.bind(*args, **kwargs)
        bound: dict[str, tuple[int, str]] = {}
        for key, spec in contract.inputs.items():
            if key in bound_args.arguments:
                contract.check(key, bound_args.arguments[key], spec, bound)
        result = fn(*args, **kwargs)
        for key, spec in contract.outputs.items():
            contract.check("the result", result if key == "output[0]" else None, spec, bound)
        return result

    wrapper.__torch_sentinel_contract__ = contract  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def expect(
    target: Any = None,
    /,
    *,
    input: Optional[Spec] = None,
    output: Optional[Spec] = None,
    name: Optional[str] = None,
    **params: str,
) -> Any:
    """Hold a module or a function to a named-axis shape contract.

    ``expect(module, input="B F", output="B H")`` installs the contract on ``module`` and
    returns a :class:`ContractHandle` (``.remove()`` takes it off). ``input``/``output`` take
    one spec (the first positional input / the output), a list (one per position) or a dict
    (keyword inputs by name, ``input[i]``/``output[i]`` by position).

    ``@expect(x="B F", w="F H", returns="B H")`` wraps a function: specs are given per
    parameter name, ``returns`` for the result.

    A mismatch raises :class:`~torch_sentinel.ShapeContractError` naming the axes that
    disagree and the right-to-left comparison behind it.
    """
    if isinstance(target, nn.Module):
        if params:
            raise TypeError("expect(module, ...) takes input= and output=, not per-parameter specs")
        return _module_contract(target, name or type(target).__name__, input, output)
    if target is not None and callable(target):
        return _function_contract(target, params, input, output)  # type: ignore[arg-type]
    if target is not None:
        raise TypeError(
            f"expect() takes an nn.Module or a function, got {type(target).__name__}"
        )

    def decorate(obj: Any) -> Any:
        return expect(obj, input=input, output=output, name=name, **params)

    return decorate

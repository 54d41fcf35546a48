"""attach() options: each bad value fails at attach(), naming the option, what was expected and
what arrived; misspelt finding kinds and threshold keys name the closest valid ones."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest
import torch
from helpers import MLP
from torch import nn

import torch_sentinel
from torch_sentinel import OptionError, SentinelError
from torch_sentinel._options import finding_kinds, threshold_keys
from torch_sentinel.detectors import builtin_detectors


def _opt(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05)


BAD = [
    ({"disable": {"platau"}}, r"unknown finding kind 'platau'(.|\n)*next:\s+did you mean 'plateau'\?"),
    ({"thresholds": {"dead_relu.fractoin": 0.9}},
     r"unknown key 'dead_relu.fractoin'(.|\n)*did you mean 'dead_relu.fraction'\?"),
    ({"thresholds": {"dead_relu.x": 0.9}}, r"unknown key 'dead_relu.x'(.|\n)*dead_relu.fraction"),
    ({"disable": None}, r"option disable is not valid\n\s+expected: a set \(or list\) of finding kinds\n\s+arrived:\s+None"),
    ({"disable": "plateau"}, r"arrived:\s+'plateau' \(str\)\n\s+next:\s+wrap it in a set: disable=\{'plateau'\}"),
    ({"disable": {"non_finite"}}, r"'non_finite' cannot be switched off(.|\n)*on_nonfinite='record'"),
    ({"update_copy_limit_bytes": "2GB"},
     r"option update_copy_limit_bytes is not valid\n\s+expected: an int >= 0\n\s+arrived:\s+'2GB' \(str\)"),
    ({"thresholds": {"dead_relu.fraction": "high"}},
     r"thresholds\['dead_relu.fraction'\] is not a number\n\s+expected: a finite number \(default 0.7\)\n\s+arrived:\s+'high'"),
    ({"thresholds": {"plateau.min_steps": 2.5}}, r"thresholds\['plateau.min_steps'\](.|\n)*whole number >= 1"),
    ({"thresholds": {"diverging.factor": float("nan")}}, r"thresholds\['diverging.factor'\] is not a number"),
    ({"thresholds": [("dead_relu.fraction", 0.9)]}, r"option thresholds is not valid\n\s+expected: a dict"),
    ({"check": "sometimes"}, r"check='sometimes' is not valid\n\s+expected: one of 'auto', 'immediate', 'deferred'"),
    ({"check": "immedate"}, r"did you mean 'immediate'\?"),
    ({"on_nonfinite": "ignore"}, r"on_nonfinite='ignore' is not valid\n\s+expected: one of 'raise', 'warn', 'record'"),
    ({"flush_every": 0}, r"option flush_every is not valid\n\s+expected: a positive int\n\s+arrived:\s+0 \(int\)"),
    ({"log_every": "2"}, r"option log_every is not valid(.|\n)*next:\s+pass a number, e.g. log_every=2"),
    ({"update_every": -1}, r"option update_every is not valid\n\s+expected: an int >= 0"),
    ({"start_step": -5}, r"option start_step is not valid\n\s+expected: an int >= 0"),
    ({"seed": "42"}, r"option seed is not valid\n\s+expected: an int, or None"),
    ({"log_dir": 3}, r"option log_dir is not valid\n\s+expected: a str or os.PathLike"),
    ({"sync_ranks": "no"}, r"option sync_ranks is not valid\n\s+expected: True or False"),
    ({"flush_evry": 3}, r"unknown option\(s\) flush_evry(.|\n)*did you mean 'flush_every'"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD, ids=[
    "kind-typo", "threshold-typo", "threshold-unknown-name", "disable-none", "disable-str", "disable-non-finite",
    "copy-limit-str", "threshold-str", "threshold-fractional-count", "threshold-nan", "thresholds-list",
    "check", "check-typo", "on-nonfinite", "flush-every", "log-every-str", "update-every", "start-step", "seed",
    "log-dir", "sync-ranks", "unknown-option",
])
def test_attach_rejects_bad_options_before_installing_anything(kwargs, match) -> None:
    m = MLP()
    with pytest.raises(OptionError, match=match) as info:
        torch_sentinel.attach(m, _opt(m), **kwargs)
    # Usable as the exception a caller would expect for a bad argument, and as a SentinelError.
    assert isinstance(info.value, (ValueError)) and isinstance(info.value, TypeError)
    assert isinstance(info.value, SentinelError)
    assert not m._forward_hooks and not m.fc1._forward_hooks
    with torch_sentinel.attach(m, _opt(m)):  # nothing was left half attached
        pass


def test_env_override_is_validated_and_named(monkeypatch) -> None:
    m = MLP()
    monkeypatch.setenv("TORCH_SENTINEL_ON_NONFINITE", "record")
    with torch_sentinel.attach(m, _opt(m), on_nonfinite="raise") as s:
        assert s.options.on_nonfinite == "record"
    monkeypatch.setenv("TORCH_SENTINEL_ON_NONFINITE", "explode")
    with pytest.raises(ValueError, match=r"\(from \$TORCH_SENTINEL_ON_NONFINITE\)(.|\n)*'raise', 'warn', 'record'"):
        torch_sentinel.attach(m, _opt(m))


def test_good_options_are_accepted_and_normalised() -> None:
    m = MLP()
    with torch_sentinel.attach(
        m, _opt(m), disable=["plateau", "diverging"], thresholds={"dead_relu.fraction": 1, "plateau.min_steps": 40.0},
        update_copy_limit_bytes=0,
    ) as s:
        assert s.options.disable == frozenset({"plateau", "diverging"})
        assert s.options.thresholds == {"dead_relu.fraction": 1.0, "plateau.min_steps": 40.0}
        assert "plateau" not in {d.kind for d in s._detectors}


def test_valid_names_come_from_the_detectors() -> None:
    """Every threshold a detector reads is declared next to it (so attach() accepts it), and
    every declared one is read: the list of valid keys cannot drift from the code."""
    detectors = builtin_detectors()
    assert finding_kinds() == [cls.kind for cls in detectors]
    keys = threshold_keys()
    package = "\n".join(p.read_text() for p in pathlib.Path(torch_sentinel.__file__).parent.rglob("*.py"))
    for cls in detectors:
        source = inspect.getsource(inspect.getmodule(cls))  # type: ignore[arg-type]
        assert "ctx.threshold(" not in source, f"{cls.__name__} reads a threshold it does not declare"
        read = set(re.findall(r'self\.threshold\("(\w+)"\)', source))
        declared = set(cls.thresholds)
        assert read <= declared | _declared_by_siblings(cls), (cls.__name__, read - declared)
        for name in declared:
            # read by the detector itself, or by the probe that serves it (by its full key)
            assert name in read or f'"{cls.kind}.{name}"' in package, f"{cls.kind}.{name} is declared but never read"
            assert f"{cls.kind}.{name}" in keys


def _declared_by_siblings(cls: type) -> set[str]:
    """Keys read in a module shared by several detectors belong to one of them."""
    module = inspect.getmodule(cls)
    return {n for other in builtin_detectors() if inspect.getmodule(other) is module for n in other.thresholds}

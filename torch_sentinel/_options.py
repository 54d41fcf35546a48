"""Options given to ``attach()``, validated up front so that a bad value fails at attach time.

Every message names the option, what was expected and what arrived; a misspelt finding kind or
threshold key names the closest valid ones. The valid kinds and threshold keys are read from the
detectors themselves (``Detector.kind`` and the ``thresholds`` each detector declares next to
where it reads them), so this module never holds a list that could drift from them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._errors import OptionError, format_message

if TYPE_CHECKING:
    from .detectors import Detector

__all__ = [
    "CHECK_MODES",
    "NONFINITE_POLICIES",
    "REPLICA_MODES",
    "Options",
    "finding_kinds",
    "resolve_check_mode",
    "threshold_keys",
]

CHECK_MODES = ("auto", "immediate", "deferred")
NONFINITE_POLICIES = ("raise", "warn", "record")
REPLICA_MODES = ("exact", "tolerance")
DIVERGENCE_POLICIES = ("raise", "warn")

#: Environment overrides, for switching behaviour on a job without touching its code.
ENV_ON_NONFINITE = "TORCH_SENTINEL_ON_NONFINITE"
ENV_CHECK = "TORCH_SENTINEL_CHECK"

#: Kinds that are reported but cannot be switched off with ``disable``, and what to do instead.
_NOT_DISABLEABLE = {
    "non_finite": "use on_nonfinite='record' (or 'warn') to keep training through a NaN",
    "shape_mismatch": "it only adds a note to a shape error that is raised anyway",
}


def _detector_classes(extra: Iterable[Any] = ()) -> list[type[Detector]]:
    from .detectors import builtin_detectors

    return [*builtin_detectors(), *(type(d) for d in extra)]


def finding_kinds(extra: Iterable[Any] = ()) -> list[str]:
    """Finding kinds that ``attach(disable=...)`` accepts: one per shipped detector, and the
    kinds of the user's own detectors (``extra``)."""
    return [cls.kind for cls in _detector_classes(extra)]


def threshold_keys(extra: Iterable[Any] = ()) -> dict[str, float]:
    """Every ``"<kind>.<name>"`` key ``attach(thresholds=...)`` accepts, with its default, as
    declared by the detectors (``thresholds`` class attribute), the user's (``extra``) too."""
    keys: dict[str, float] = {}
    for cls in _detector_classes(extra):
        for name, declared in cls.thresholds.items():
            keys[f"{cls.kind}.{name}"] = declared.default
    return keys


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _fail(option: str, expected: str, value: Any, next_check: Optional[str] = None,
          headline: Optional[str] = None) -> OptionError:
    return OptionError(
        format_message(
            headline or f"attach() option {option} is not valid",
            expected=expected,
            arrived=_describe(value),
            next_check=next_check,
        )
    )


def _closest(name: str, valid: Iterable[str]) -> list[str]:
    """Up to three valid names close to ``name``; only the clear winner when there is one."""
    scored = []
    for v in valid:
        ratio = difflib.SequenceMatcher(None, name, v).ratio()
        if ratio >= 0.6:
            scored.append((ratio, v))
    scored.sort(key=lambda rv: -rv[0])
    if not scored:
        return []
    best = scored[0][0]
    return [v for r, v in scored[:3] if r >= best - 0.05]


def _did_you_mean(name: str, valid: list[str]) -> str:
    close = _closest(name, valid)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "valid names: " + ", ".join(repr(v) for v in valid)


def _choice(name: str, value: Any, valid: tuple[str, ...], source: str = "") -> str:
    if not isinstance(value, str) or value not in valid:
        where = f" (from {source})" if source else ""
        hint = _did_you_mean(value, list(valid)) if isinstance(value, str) else None
        raise _fail(
            name,
            "one of " + ", ".join(repr(v) for v in valid),
            value,
            hint,
            headline=f"attach() option {name}={value!r}{where} is not valid",
        )
    return value


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        next_check = None
        if isinstance(value, str):
            next_check = f"pass a number, e.g. {name}={value.strip() or 0}" if value.strip().isdigit() else (
                "pass a plain number of bytes, e.g. 2 << 30 for 2 GiB" if name.endswith("_bytes")
                else "pass a plain number of steps"
            )
        raise _fail(name, what, value, next_check)
    return int(value)


@dataclasses.dataclass
class Options:
    """Everything ``attach()`` accepts besides the model and optimizer."""

    log_dir: Optional[str] = None
    check: str = "auto"
    flush_every: int = 10
    log_every: int = 1
    on_nonfinite: str = "raise"
    seed: Optional[int] = None
    #: Finding kinds to switch off, e.g. {"plateau"}.
    disable: frozenset[str] = frozenset()
    #: Per-detector threshold overrides, e.g. {"dead_relu.fraction": 0.9}.
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Exact update/weight ratios need a copy of the parameters; it is taken every this many
    #: steps (0 turns it off). None: every 10 steps, unless the parameters take more than
    #: ``update_copy_limit_bytes``, where the copy would cost too much memory.
    update_every: Optional[int] = None
    update_copy_limit_bytes: int = 2 << 30
    #: Write TensorBoard and JSONL from every rank, not only rank 0.
    per_rank_logs: bool = False
    #: In distributed runs, agree on non-finite faults across ranks (one 16-byte all-reduce per
    #: training forward, ``_distributed.py``) so that every rank raises together.
    sync_ranks: bool = True
    #: When torch.compile silently skipped the hooks: "reset" drops the compiled code of this
    #: model only, once (logged), so it recompiles with them (every other compiled function
    #: keeps its code; dynamo is never reset process-wide); "raise" raises InstrumentationError.
    blind_hooks: str = "reset"
    #: The number of the first step watched: a resumed run continues its step numbering
    #: (TensorBoard, findings, incidents) from here instead of restarting at 0.
    start_step: int = 0
    #: Steps between writes of the per-module TensorBoard scalars (global ones follow
    #: ``log_every``). None: chosen from the model's size so that they stay under ~2 KB of
    #: events per step (every 10 steps for a 125-module transformer); see ``sinks/schedule.py``.
    module_log_every: Optional[int] = None
    #: Number steps as a training framework does: called when a step's row closes, it returns
    #: the number of the next step (the Lightning callback passes ``global_step + 1``).
    step_source: Optional[Callable[[], int]] = None
    #: The user's own detectors (``torch_sentinel.Detector`` instances), run beside the built-in ones.
    detectors: tuple[Any, ...] = ()
    #: Optimizer steps between checks that data-parallel replicas hold the same parameters
    #: and optimizer state (``_replicas/``): a check runs at the first training forward after
    #: some rank closed that many more steps (with ``sync_ranks=False``: every that many
    #: training forwards). None: every 200 when the model is wrapped in DDP or replicated along
    #: a mesh dimension (HSDP), else off; 0: off. Given explicitly, it also compares an
    #: unwrapped model across the default process group.
    replica_check_every: Optional[int] = None
    #: "exact": bit-identical replicas; "tolerance": within ``replica_divergence.rtol`` of the
    #: tensor's norm (for setups whose reductions are not deterministic).
    replica_check: str = "exact"
    #: "raise": ReplicaDivergenceError on every rank at the same step; "warn": a finding, go on.
    on_divergence: str = "raise"
    #: Low-precision formats whose headroom is measured on sampled steps ("bf16", "fp16",
    #: "e4m3", "e5m2"; see docs/precision.md). None: the dtype the run computes in when it is
    #: bf16 or fp16 (weights, or autocast at the first training forward), nothing on a float32
    #: run; () switches it off.
    precision: Optional[tuple[str, ...]] = None

    @classmethod
    def build(cls, **kwargs: Any) -> Options:
        names = sorted(f.name for f in dataclasses.fields(cls))
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            hints = [f"{u!r}: {_did_you_mean(u, names)}" for u in unknown]
            raise OptionError(
                format_message(
                    f"attach() got unknown option(s) {', '.join(unknown)}",
                    expected=f"some of {', '.join(names)}",
                    arrived=", ".join(f"{u}=" for u in unknown),
                    next_check="; ".join(hints),
                )
            )
        opts = cls(**kwargs)
        opts.validate()
        return opts

    def validate(self) -> None:
        env_policy = os.environ.get(ENV_ON_NONFINITE)
        if env_policy:
            self.on_nonfinite = _choice(
                "on_nonfinite", env_policy, NONFINITE_POLICIES, f"${ENV_ON_NONFINITE}"
            )
        else:
            self.on_nonfinite = _choice("on_nonfinite", self.on_nonfinite, NONFINITE_POLICIES)
        env_check = os.environ.get(ENV_CHECK)
        if env_check:
            self.check = _choice("check", env_check, CHECK_MODES, f"${ENV_CHECK}")
        else:
            self.check = _choice("check", self.check, CHECK_MODES)
        self.blind_hooks = _choice("blind_hooks", self.blind_hooks, ("reset", "raise"))
        self.flush_every = _int("flush_every", self.flush_every, 1)
        self.log_every = _int("log_every", self.log_every, 1)
        if self.update_every is not None:
            self.update_every = _int("update_every", self.update_every, 0)
        self.update_copy_limit_bytes = _int("update_copy_limit_bytes", self.update_copy_limit_bytes, 0)
        self.start_step = _int("start_step", self.start_step, 0)
        if self.module_log_every is not None:
            self.module_log_every = _int("module_log_every", self.module_log_every, 1)
        if self.replica_check_every is not None:
            self.replica_check_every = _int("replica_check_every", self.replica_check_every, 0)
        self.replica_check = _choice("replica_check", self.replica_check, REPLICA_MODES)
        self.on_divergence = _choice("on_divergence", self.on_divergence, DIVERGENCE_POLICIES)
        if self.step_source is not None and not callable(self.step_source):
            raise _fail("step_source", "a callable returning the next step's number, or None", self.step_source)
        for flag in ("per_rank_logs", "sync_ranks"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, "True or False", getattr(self, flag))
        if self.log_dir is not None:
            if not isinstance(self.log_dir, (str, os.PathLike)):
                raise _fail("log_dir", "a str or os.PathLike (a directory), or None", self.log_dir)
            self.log_dir = os.fspath(self.log_dir)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise _fail("seed", "an int, or None", self.seed)
        self.detectors = _detectors(self.detectors)
        self.disable = _disable(self.disable, self.detectors)
        self.thresholds = _thresholds(self.thresholds, self.detectors)
        if self.precision is not None:
            self.precision = _precision(self.precision)


def _detectors(value: Any) -> tuple[Any, ...]:
    from ._findings import BOUNDARIES
    from .detectors import Detector, Threshold

    example = "e.g. detectors=[MyDetector()]"
    if isinstance(value, (str, Mapping)) or not isinstance(value, Iterable):
        raise _fail("detectors", f"a list of torch_sentinel.Detector instances, {example}", value)
    out = tuple(value)
    taken = set(finding_kinds())
    for d in out:
        if isinstance(d, type) and issubclass(d, Detector):
            raise _fail("detectors", "Detector instances, not classes", d, f"instantiate it: detectors=[{d.__name__}()]",
                        headline="attach() option detectors holds a class")
        if not isinstance(d, Detector):
            raise _fail("detectors", f"torch_sentinel.Detector instances, {example}", d,
                        "subclass torch_sentinel.Detector (see the README's 'Writing a detector')",
                        headline="attach() option detectors holds something that is not a Detector")
        name = type(d).__name__
        if not isinstance(d.kind, str) or not d.kind:
            raise _fail("detectors", "a detector class with a `kind` (its finding kind, a str)", d,
                        f"set kind = \"...\" on {name}", headline=f"attach() option detectors: {name} has no kind")
        if d.kind in taken:
            raise _fail("detectors", "a kind no other detector uses", d.kind,
                        f"rename {name}.kind (the built-in and given kinds: {', '.join(sorted(taken))})",
                        headline=f"attach() option detectors: the kind {d.kind!r} is taken")
        if d.rung not in BOUNDARIES:
            raise _fail("detectors", "a rung of the ladder: " + ", ".join(BOUNDARIES), d.rung,
                        _did_you_mean(str(d.rung), list(BOUNDARIES)),
                        headline=f"attach() option detectors: {name}.rung is not a rung of the ladder")
        for key, declared in d.thresholds.items():
            if not isinstance(declared, Threshold):
                raise _fail("detectors", "thresholds declared as Threshold(default, source)", declared,
                            f"write {name}.thresholds = {{{key!r}: Threshold({declared!r}, \"where it comes from\")}}",
                            headline=f"attach() option detectors: {name}.thresholds[{key!r}] is not a Threshold")
        taken.add(d.kind)
    return out


def _disable(value: Any, detectors: tuple[Any, ...] = ()) -> frozenset[str]:
    kinds = finding_kinds(detectors)
    example = "e.g. disable={'plateau'}"
    if isinstance(value, str) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        hint = f"wrap it in a set: disable={{{value!r}}}" if isinstance(value, str) else (
            f"leave it out to keep every check, or pass a set of finding kinds, {example}"
        )
        raise _fail("disable", "a set (or list) of finding kinds", value, hint)
    out = set()
    for kind in value:
        if not isinstance(kind, str):
            raise _fail("disable", f"finding kinds as str, {example}", kind,
                        headline="attach() option disable holds a value that is not a finding kind")
        if kind in _NOT_DISABLEABLE:
            raise _fail("disable", "kinds that can be switched off: " + ", ".join(kinds), kind,
                        f"{kind!r} cannot be disabled: {_NOT_DISABLEABLE[kind]}",
                        headline=f"attach() option disable: {kind!r} cannot be switched off")
        if kind not in kinds:
            raise _fail("disable", "finding kinds: " + ", ".join(kinds), kind,
                        _did_you_mean(kind, kinds),
                        headline=f"attach() option disable: unknown finding kind {kind!r}")
        out.add(kind)
    return frozenset(out)


def _precision(value: Any) -> tuple[str, ...]:
    """Canonical format names, in the order given, each once."""
    import torch

    from .precision.formats import FORMATS, canonical_format

    valid = list(FORMATS)
    example = "e.g. precision=('bf16', 'e4m3')"
    if isinstance(value, (str, torch.dtype)) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        hint = (f"wrap it in a tuple: precision=({value!r},)" if canonical_format(value)
                else f"leave it out for the default, or pass a tuple of formats, {example}")
        raise _fail("precision", "a tuple (or list) of formats: " + ", ".join(valid), value, hint)
    out: list[str] = []
    for item in value:
        name = canonical_format(item)
        if name is None:
            hint = _did_you_mean(item, valid) if isinstance(item, str) else f"name each format as a string, {example}"
            raise _fail("precision", "formats: " + ", ".join(repr(v) for v in valid), item, hint,
                        headline=f"attach() option precision: unknown format {item!r}")
        if name not in out:
            out.append(name)
    return tuple(out)


def _thresholds(value: Any, detectors: tuple[Any, ...] = ()) -> dict[str, float]:
    example = "e.g. thresholds={'dead_relu.fraction': 0.9}"
    if not isinstance(value, Mapping):
        raise _fail("thresholds", f"a dict of '<kind>.<name>': number, {example}", value,
                    "leave it out to keep every default")
    known = threshold_keys(detectors)
    out: dict[str, float] = {}
    for key, number in value.items():
        if not isinstance(key, str) or key not in known:
            valid = sorted(known)
            prefix = key.partition(".")[0] + "." if isinstance(key, str) else ""
            same_kind = [k for k in valid if prefix and k.startswith(prefix)]
            hint = _did_you_mean(key, valid) if isinstance(key, str) and _closest(key, valid) else (
                "keys of this detector: " + ", ".join(same_kind) if same_kind
                else "valid keys: " + ", ".join(valid)
            )
            raise _fail("thresholds", f"keys '<kind>.<name>' declared by the detectors, {example}", key, hint,
                        headline=f"attach() option thresholds: unknown key {key!r}")
        default = known[key]
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(number):
            raise _fail(f"thresholds[{key!r}]", f"a finite number (default {default!r})", number,
                        headline=f"attach() option thresholds[{key!r}] is not a number")
        if isinstance(default, int) and (not float(number).is_integer() or number < 1):
            raise _fail(f"thresholds[{key!r}]", f"a whole number >= 1, a count of steps or samples (default {default})",
                        number)
        if number <= 0:
            raise _fail(f"thresholds[{key!r}]", f"a number > 0 (default {default!r})", number)
        out[key] = float(number)
    return out


def resolve_check_mode(check: str, device_type: str) -> str:
    """'auto' reads the host immediately on CPU, where a read is a memory load, and defers on
    accelerators, where a read would stall the stream."""
    if check != "auto":
        return check
    return "immediate" if device_type == "cpu" else "deferred"

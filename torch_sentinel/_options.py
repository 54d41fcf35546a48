"""Options given to ``attach()``, validated up front so that a bad value fails at attach time."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional, Union

__all__ = ["CHECK_MODES", "NONFINITE_POLICIES", "Options", "resolve_check_mode"]

CHECK_MODES = ("auto", "immediate", "deferred")
NONFINITE_POLICIES = ("raise", "warn", "record")

#: Environment overrides, for switching behaviour on a job without touching its code.
ENV_ON_NONFINITE = "TORCH_SENTINEL_ON_NONFINITE"
ENV_CHECK = "TORCH_SENTINEL_CHECK"


def _choice(name: str, value: Any, valid: tuple[str, ...], source: str = "") -> str:
    if not isinstance(value, str) or value not in valid:
        where = f" (from {source})" if source else ""
        raise ValueError(
            f"{name}={value!r}{where} is not valid: expected one of "
            + ", ".join(repr(v) for v in valid)
        )
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


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
    #: In distributed runs, reduce non-finite flags across ranks so every rank raises together.
    sync_ranks: bool = True
    #: When torch.compile silently skipped the hooks: "reset" drops dynamo's compiled code once
    #: (logged) so it recompiles with them; "raise" raises InstrumentationError instead.
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

    @classmethod
    def build(cls, **kwargs: Any) -> Options:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"attach() got unknown option(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(sorted(names))}"
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
        self.flush_every = _positive_int("flush_every", self.flush_every)
        self.log_every = _positive_int("log_every", self.log_every)
        if self.module_log_every is not None:
            self.module_log_every = _positive_int("module_log_every", self.module_log_every)
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"start_step must be an int >= 0, got {self.start_step!r}")
        if self.step_source is not None and not callable(self.step_source):
            raise TypeError(f"step_source must be a callable returning an int, got {type(self.step_source).__name__}")
        if self.update_every is not None and (
            isinstance(self.update_every, bool) or not isinstance(self.update_every, int) or self.update_every < 0
        ):
            raise ValueError(f"update_every must be an int >= 0, got {self.update_every!r}")
        if self.log_dir is not None and not isinstance(self.log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir must be a str or os.PathLike, got {type(self.log_dir).__name__}")
        if self.log_dir is not None:
            self.log_dir = os.fspath(self.log_dir)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")
        if isinstance(self.disable, str):
            raise TypeError("disable must be a collection of finding kinds, not a single str")
        self.disable = frozenset(self.disable)
        if not isinstance(self.thresholds, dict):
            raise TypeError(f"thresholds must be a dict, got {type(self.thresholds).__name__}")


def resolve_check_mode(check: str, device_type: str) -> str:
    """'auto' reads the host immediately on CPU, where a read is a memory load, and defers on
    accelerators, where a read would stall the stream."""
    if check != "auto":
        return check
    return "immediate" if device_type == "cpu" else "deferred"


OptimizerArg = Union[Any, list, tuple, None]

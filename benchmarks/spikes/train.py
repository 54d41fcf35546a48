"""One benchmark run: resume the trained checkpoint, train, inject (or not), keep the evidence.

Two ways to watch a run:

- ``watch="sentinel"``: ``torch_sentinel.attach`` on the model, as a user would; the run keeps
  the loss trace and the ``loss_spike`` findings. The published figures come from these runs.
- ``watch="recorder"``: plain hooks in the loop record, every step, the same per-parameter
  figures the sentinel's ring holds (gradient norm before clipping, update, weight, ``exp_avg``
  and ``exp_avg_sq`` norms, each attention layer's largest logit, the output log-sum-exp): the
  offline traces the forensics were developed on (``develop.py``).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from torch_sentinel._collect.spike_stats import max_attention_logit, mean_logsumexp, stacked_norms

from .injections import Injection
from .model import GPT, Attention, Config, Corpus, lm_loss, param_groups

__all__ = ["Run", "Trace", "pretrain", "run"]


@dataclasses.dataclass(frozen=True)
class Run:
    """A run: ``steps`` steps from ``checkpoint`` with data seed ``seed``; ``injection`` or clean."""

    seed: int
    steps: int
    checkpoint: str
    injection: Optional[Injection] = None
    beta2: float = 0.95
    lr: float = 1e-3

    @property
    def name(self) -> str:
        what = self.injection.cause if self.injection else "clean"
        return f"{what}-{self.seed}"


@dataclasses.dataclass
class Trace:
    """What a run leaves: the losses, and per watch its evidence."""

    run: Run
    loss: np.ndarray
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: recorder: stat name -> [steps, P or A] arrays, and the layout.
    recorded: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    #: The step at which the sentinel raised NonFiniteError and the run stopped (None: it ran on).
    stopped_at: Optional[int] = None


DEFAULT = Config()


def pretrain(seed: int, steps: int, path: str, cfg: Config = DEFAULT) -> float:
    """Train the base model from scratch and save model and optimizer state to ``path``."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = torch.optim.AdamW(param_groups(model), lr=cfg.lr, betas=(0.9, cfg.beta2), weight_decay=cfg.weight_decay)
    corpus, g = Corpus(), torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup)
        x, y = corpus.batch(g, cfg.batch, cfg.seq)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip or math.inf)
        opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "steps": steps}, path)
    return float(loss.detach())


class _Recorder:
    """Plain hooks: the ring's per-parameter figures for every step (see module docstring)."""

    def __init__(self, model: GPT, opt: torch.optim.Optimizer, steps: int) -> None:
        self.model, self.opt = model, opt
        self.names = [n for n, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        self.attn = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
        p, a = len(self.params), len(self.attn)
        self.data = {k: np.full((steps, p), np.nan) for k in ("grad", "update", "weight", "exp_avg", "exp_avg_sq")}
        self.data["attention_logit"] = np.full((steps, a), np.nan)
        self.data["output_lse"] = np.full((steps,), np.nan)
        self.data["inputs"] = np.full((steps, 2), np.nan)
        self.data["lr"] = np.full((steps, len(opt.param_groups)), np.nan)
        self._current: Optional[int] = None
        self._shadow: list[torch.Tensor] = []
        self._handles = [m.register_forward_pre_hook(self._enter(i)) for i, (_, m) in enumerate(self.attn)]
        self._sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._on_sdpa  # type: ignore[assignment]
        self.step = 0

    def _enter(self, i: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            self._current = i
        return hook

    def _on_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._current is not None and torch.is_grad_enabled():
            self.data["attention_logit"][self.step, self._current] = float(max_attention_logit(q, k, kwargs.get("scale")))
        return self._sdpa(q, k, v, *args, **kwargs)

    def forward_done(self, x: torch.Tensor, logits: torch.Tensor) -> None:
        self.data["output_lse"][self.step] = float(mean_logsumexp(logits))
        self.data["inputs"][self.step] = (float(x.min()), float(x.max()))

    def before_clip(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros(()) for p in self.params]
        self.data["grad"][self.step] = stacked_norms(grads, 2).numpy()

    def before_update(self) -> None:
        self._shadow = [p.detach().clone() for p in self.params]

    def after_update(self) -> None:
        step = self.step
        with torch.no_grad():
            torch._foreach_sub_(self._shadow, [p.detach() for p in self.params])
            self.data["update"][step] = stacked_norms(self._shadow, 2).numpy()
            self.data["weight"][step] = stacked_norms([p.detach() for p in self.params], 2).numpy()
            states = [self.opt.state.get(p, {}) for p in self.params]
            empty = torch.zeros(())
            self.data["exp_avg"][step] = stacked_norms([s.get("exp_avg", empty) for s in states], 2).numpy()
            self.data["exp_avg_sq"][step] = stacked_norms([s.get("exp_avg_sq", empty) for s in states], 1).numpy()
        self.data["lr"][step] = [g["lr"] for g in self.opt.param_groups]
        self.step += 1

    def close(self) -> None:
        F.scaled_dot_product_attention = self._sdpa  # type: ignore[assignment]
        for h in self._handles:
            h.remove()

    def layout(self, model: GPT) -> dict[str, Any]:
        owners = [n.rpartition(".")[0] for n in self.names]
        group_of = {}
        for group in self.opt.param_groups:
            for p in group["params"]:
                group_of[id(p)] = group["name"]
        return {"params": self.names, "owners": owners, "groups": [group_of[id(p)] for p in self.params],
                "numel": [p.numel() for p in self.params], "attention": [n for n, _ in self.attn],
                "lr_groups": [g["name"] for g in self.opt.param_groups], "output": "head"}


def run(spec: Run, watch: str = "sentinel", sentinel_options: Optional[dict[str, Any]] = None,
        cfg: Config = DEFAULT, sinks: Sequence[Any] = ()) -> Trace:
    """Run ``spec`` and return its trace (see the module docstring for ``watch``; ``sinks``
    are added to the sentinel)."""
    import time

    import torch_sentinel
    from torch_sentinel import NonFiniteError

    state = torch.load(spec.checkpoint, weights_only=True)
    torch.manual_seed(spec.seed)
    model = GPT(cfg)
    model.load_state_dict(state["model"])
    beta2 = spec.injection.beta2 if spec.injection else spec.beta2
    opt = torch.optim.AdamW(param_groups(model), lr=cfg.lr, betas=(0.9, beta2), weight_decay=cfg.weight_decay)
    opt.load_state_dict(state["optimizer"])
    for group in opt.param_groups:
        group["betas"] = (0.9, beta2)
    corpus, g = Corpus(), torch.Generator().manual_seed(spec.seed)
    inj = spec.injection
    recorder = _Recorder(model, opt, spec.steps) if watch == "recorder" else None
    sentinel = None
    if watch == "sentinel":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sentinel = torch_sentinel.attach(model, opt, **(sentinel_options or {}))
        for sink in sinks:
            sentinel.add_sink(sink)
    losses = np.full(spec.steps, np.nan)
    trace_stopped: Optional[int] = None
    step = -1
    start = time.perf_counter()
    try:
        for step in range(spec.steps):
            for group in opt.param_groups:
                group["lr"] = spec.lr
            x, y = corpus.batch(g, cfg.batch, cfg.seq)
            if inj is not None:
                x, y = inj.batch(step, x, y, g)
                inj.before_forward(step, model, opt, g)
            opt.zero_grad(set_to_none=False)
            logits = model(x)
            loss = lm_loss(logits, y)
            losses[step] = float(loss.detach())
            loss.backward()
            if inj is not None:
                inj.after_backward(step, model)
            if recorder is not None:
                recorder.forward_done(x, logits)
                recorder.before_clip()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip or math.inf)
            if recorder is not None:
                recorder.before_update()
            opt.step()
            if recorder is not None:
                recorder.after_update()
    except NonFiniteError:
        # The sentinel stopped the run, as it stops a user's (its report keeps the non_finite
        # finding, with the step and module); the baselines see the losses up to this step's.
        trace_stopped = step
    finally:
        seconds = time.perf_counter() - start
        findings: list[dict[str, Any]] = []
        if sentinel is not None:
            findings = [f.to_dict() for f in sentinel.report().findings]
            sentinel.detach()
        if recorder is not None:
            recorder.close()
    trace = Trace(spec, losses, findings, seconds=seconds, stopped_at=trace_stopped)
    if recorder is not None:
        trace.recorded = recorder.data
        trace.layout = recorder.layout(model)
    return trace

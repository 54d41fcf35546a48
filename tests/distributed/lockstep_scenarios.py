"""Scenarios for the lockstep point (test_lockstep.py asserts), on replica_scenarios' harness:
4 real gloo ranks, DDP (or a plain model), the sentinel with its defaults unless said otherwise.

Each loop runs ``steps`` optimizer steps of ``micro`` micro-batches (gradient accumulation under
DDP's ``no_sync`` for all but the last), and injects what ``kw`` says on one rank:

- ``skip``: that rank skips ``optimizer.step()`` at step ``skip_at``;
- ``nan``: a NaN in that rank's micro-batch ``nan_micro`` of step ``nan_at``;
- ``flip``: a bit of ``fc1.weight`` flipped after the update of step ``flip_at``;
- ``eval_every``: rank 0 alone runs an evaluation forward of the DDP model under ``no_grad``
  before every ``eval_every``-th step.
"""

from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist
from distributed.replica_scenarios import Net, _flip, batch
from torch import nn


def _loop(rank: int, result: dict[str, Any], kw: dict[str, Any], model: nn.Module,
          opt: torch.optim.Optimizer, sentinel: Any, call: Any = None) -> None:
    import torch_sentinel

    micro = kw.get("micro", 1)
    call = call or model
    root = getattr(model, "module", model)
    try:
        for step in range(kw.get("steps", 12)):
            if kw.get("eval_every") and step % kw["eval_every"] == 0 and rank == 0:
                with torch.no_grad():
                    model(batch(rank, 1000 + step))
            opt.zero_grad()
            for m in range(micro):
                x = batch(rank, 10 * step + m)
                if rank == kw.get("nan") and step == kw.get("nan_at") and m == kw.get("nan_micro", 0):
                    x[0, 0] = float("nan")
                last = m == micro - 1
                ddp = isinstance(model, nn.parallel.DistributedDataParallel)
                with model.no_sync() if ddp and not last else contextlib.nullcontext():
                    (call(x).pow(2).mean() / micro).backward()
            if not (rank == kw.get("skip") and step == kw.get("skip_at")):
                opt.step()
            if rank == kw.get("flip") and step == kw.get("flip_at"):
                _flip(root.fc1.weight, 123, 0)
            result["last_step"] = step
    except torch_sentinel.NonFiniteError as err:
        package = os.path.dirname(os.path.abspath(torch_sentinel.__file__)) + os.sep
        ours = sum(f.filename.startswith(package) for f in traceback.extract_tb(err.__traceback__))
        result.update(raised="nonfinite", step=err.step, rank_blamed=err.rank, boundary=err.boundary,
                      module=err.module, at=sentinel.step, message=str(err).splitlines()[0], our_frames=ours,
                      finite_weights=all(bool(torch.isfinite(p).all()) for p in model.parameters()))
    except torch_sentinel.ReplicaDivergenceError as err:
        result.update(raised="replica", step=err.step, rank_blamed=err.rank, parameter=err.parameter,
                      at=sentinel.step, evidence=err.evidence)


def _report(rank: int, result: dict[str, Any], sentinel: Any) -> None:
    """report() on every rank (a collective), recording a NonFiniteError it raises."""
    import torch_sentinel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = sentinel.report()
        except torch_sentinel.NonFiniteError as err:
            result.update(report_raised=True, step=err.step, rank_blamed=err.rank, boundary=err.boundary)
            report = sentinel.report()  # now it returns (the fault was reported)
    result["report_warned"] = sum("replicas differ" in str(w.message) for w in caught)
    result["kinds"] = sorted(report.kinds())
    result["replica_findings"] = [
        {"rank": f.rank, "step": f.step, "evidence": f.evidence} for f in report.findings
        if f.kind == "replica_divergence"]
    sentinel.detach()


def ddp(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """A DDP model with SGD, attached with the defaults (plus ``kw["attach"]``)."""
    import torch_sentinel

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sentinel = torch_sentinel.attach(model, opt, **kw.get("attach", {}))
    _loop(rank, result, kw, model, opt, sentinel)
    _report(rank, result, sentinel)


def submodules_only(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """A plain model whose loop calls its submodules, never its forward (gradients averaged by
    hand): no training forward of the attached model, so the agreement runs at row closes."""
    import torch_sentinel

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt)

    def call(x: torch.Tensor) -> torch.Tensor:
        return model.fc2(model.act(model.fc1(x)))

    original_step = opt.step

    def step(*args: Any, **kwargs: Any) -> Any:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        return original_step(*args, **kwargs)

    opt.step = step  # type: ignore[method-assign]
    _loop(rank, result, kw, model, opt, sentinel, call=call)
    _report(rank, result, sentinel)

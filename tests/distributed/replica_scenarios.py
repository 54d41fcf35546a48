"""Scenarios for the replica check, each run on WORLD real gloo ranks (test_replicas.py asserts).

Every scenario trains a small model for a few steps, injects one fault on one rank, and writes
what each rank saw into a result dict (JSON). Faults are injected after a step's update, so the
weights the next check compares are the faulty ones. With ``replica_check_every=3`` checks run
at the start of steps 0, 3, 6 and 9: a fault at step 4 or 5 is first seen at step 6.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WORLD = 4
TIMEOUT_S = 150
STEPS = 12
EVERY = 3


class Net(nn.Module):
    """fc1.weight has 32,768 elements: the bisection takes two rounds (512, then 8)."""

    def __init__(self, spare: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 512)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(512, 4)
        if spare:
            self.spare = nn.Parameter(torch.zeros(1000))  # never used in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 64, generator=g)


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ---------------------------------------------------------------------------- faults
def _flip(t: torch.Tensor, index: int, bit: int) -> None:
    with torch.no_grad():
        words = t.detach().view(-1).view(torch.int32)
        words[index] ^= (1 << bit) if bit < 31 else -(1 << 31)


def _target(model: nn.Module, opt: torch.optim.Optimizer, kw: dict[str, Any]) -> torch.Tensor:
    """The tensor a scenario corrupts (a parameter, or one optimizer state tensor of it)."""
    root = getattr(model, "module", model)
    param = dict(root.named_parameters())[kw["parameter"]]
    if kw.get("state"):
        return opt.state[param][kw["state"]]
    return param


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def train(rank: int, result: dict[str, Any], kw: dict[str, Any], model: nn.Module,
          opt: torch.optim.Optimizer, sentinel: Any) -> None:
    """The loop every scenario runs, with kw's fault on rank kw["bad"] at step kw["at"]."""
    import torch_sentinel

    fault, bad, at = kw.get("fault"), kw.get("bad"), kw.get("at")
    try:
        for step in range(kw.get("steps", STEPS)):
            x = batch(rank, step)
            if fault == "nan" and rank == bad and step == at:
                x[0, 0] = float("nan")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            if rank == bad and step == at and fault == "grad":
                _local(_target(model, opt, kw).grad).view(-1)[kw["index"]] += 1.0
            if not (rank == bad and step == at and fault == "skip"):
                opt.step()
            if kw.get("noise"):
                g = torch.Generator().manual_seed(7919 * rank + step)  # independent on each rank
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 + kw["noise"] * (2 * torch.rand(p.shape, generator=g) - 1))
            if rank == bad and step == at:
                if fault == "flip":
                    _flip(_local(_target(model, opt, kw)), kw["index"], kw["bit"])
                elif fault == "add":
                    with torch.no_grad():
                        _local(_target(model, opt, kw)).view(-1)[kw["index"]] += 1e-3
            result["last_step"] = step
    except torch_sentinel.ReplicaDivergenceError as err:
        result.update(raised="replica", step=err.step, rank_blamed=err.rank, ranks=list(err.ranks),
                      parameter=err.parameter, state=err.state, module=err.module,
                      chunk=list(err.chunk) if err.chunk else None, message=str(err),
                      at=sentinel.step, evidence=err.evidence)
        if err.chunk:  # this rank's values there, for the test to compare across ranks
            root = getattr(model, "module", model)
            t = dict(root.named_parameters())[err.parameter]
            t = opt.state[t][err.state] if err.state else t
            result["values"] = _local(t).detach().reshape(-1)[err.chunk[0]:err.chunk[1]].tolist()
    except torch_sentinel.NonFiniteError as err:
        result.update(raised="nonfinite", step=err.step, rank_blamed=err.rank, at=sentinel.step)


def _ddp(spare: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(spare), find_unused_parameters=spare)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _report(result: dict[str, Any], sentinel: Any) -> None:
    report = sentinel.report()  # a collective: every rank gets here
    found = [f for f in report.findings if f.kind == "replica_divergence"]
    result["findings"] = [{"severity": f.severity, "rank": f.rank, "module": f.module, "step": f.step,
                           "boundary": f.boundary, "evidence": f.evidence} for f in found]
    result["kinds"] = sorted(report.kinds())
    sentinel.detach()


# ---------------------------------------------------------------------------- scenarios
def ddp_fault(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    import torch_sentinel

    model, opt = _ddp(kw.get("fault") == "add" and kw["parameter"] == "spare")
    options = {k: kw[k] for k in ("replica_check", "on_divergence", "sync_ranks") if k in kw}
    sentinel = torch_sentinel.attach(model, opt, replica_check_every=kw.get("every", EVERY), **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(rank, result, kw, model, opt, sentinel)
    result["warned"] = sum("replicas differ" in str(w.message) for w in caught)
    _report(result, sentinel)


def check_fails_on_one_rank(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """Rank 1's fingerprinting raises at the check of step 3: every rank switches the check off
    together, nobody hangs, and the later flip goes unseen (honestly: the check is off)."""
    import torch_sentinel
    from torch_sentinel._replicas import fingerprint

    lines = LogLines()
    logging.getLogger("torch_sentinel").addHandler(lines)
    original = fingerprint.Marker.rows
    calls = {"n": 0}

    def failing(self: Any, *args: Any) -> torch.Tensor:
        calls["n"] += 1
        if rank == 1 and calls["n"] == 2:
            raise RuntimeError("injected failure")
        return original(self, *args)

    fingerprint.Marker.rows = failing  # type: ignore[method-assign]
    try:
        model, opt = _ddp()
        sentinel = torch_sentinel.attach(model, opt, replica_check_every=EVERY)
        train(rank, result, kw, model, opt, sentinel)
        _report(result, sentinel)
    finally:
        fingerprint.Marker.rows = original  # type: ignore[method-assign]
        logging.getLogger("torch_sentinel").removeHandler(lines)
    result["log"] = lines.lines


def sync_audit(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """Per step: host reads (bare loop vs attached) and device ops (check off vs every 4)."""
    import torch_sentinel
    from torch_sentinel.testing import count_host_syncs, count_launches

    model, opt = _ddp()

    def one(step: int) -> tuple[int, int]:
        with count_host_syncs() as syncs, count_launches() as launches:
            opt.zero_grad()
            model(batch(rank, step)).pow(2).mean().backward()
            opt.step()
        return syncs.count, launches.count

    for s in range(3):
        one(s)  # DDP's one-off work (bucket rebuild)
    result["bare"] = [one(s)[0] for s in range(3, 6)]
    for label, every in (("off", 0), ("on", 4)):  # the same step numbers: the same sampling
        sentinel = torch_sentinel.attach(model, opt, check="deferred", flush_every=1000,
                                         replica_check_every=every)
        result[label] = [one(s) for s in range(6, 15)]  # checks at attached forwards 0, 4, 8
        sentinel.detach()


def unwrapped(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """A plain model under a process group (replicas kept equal by identical data): off by
    default, compared when replica_check_every is given."""
    import torch_sentinel

    for label, every in (("default", None), ("explicit", EVERY)):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sentinel = torch_sentinel.attach(model, opt, replica_check_every=every)
        sub: dict[str, Any] = {}
        train(0, sub, {**kw, "bad": 0 if rank == 1 else -1}, model, opt, sentinel)  # same data everywhere
        result[label] = sub
        sentinel.report(all_ranks=False)
        sentinel.detach()
        dist.barrier()


def fsdp(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """FSDP2 on a 1-D mesh (no replicas: one info finding) or HSDP on a 2x2 mesh (replicas
    along dimension 0: ranks {0, 2} and {1, 3})."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import torch_sentinel

    torch.manual_seed(0)
    model = Net()
    mesh = (init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")) if kw["hsdp"]
            else init_device_mesh("cpu", (WORLD,)))
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sentinel = torch_sentinel.attach(model, opt, replica_check_every=kw.get("every"))
    result["local_shape"] = list(model.fc1.weight.to_local().shape)
    train(rank, result, kw, model, opt, sentinel)
    _report(result, sentinel)

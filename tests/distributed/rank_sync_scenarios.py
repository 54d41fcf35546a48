"""Scenarios for rank-consistent raises, rank-0 logging, cross-rank reports and FSDP2 norms,
each run on WORLD real gloo ranks by ``harness.run_ranks`` (test_rank_sync.py asserts)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

WORLD = 2


class Gate(nn.Module):
    """Multiplies by a plain attribute (not a buffer: DDP would broadcast rank 0's), which the
    test sets to inf on one rank to fault that rank's forward alone."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.gate = Gate()
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.act(self.fc1(x))))


def _ddp(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.parallel.DistributedDataParallel(Net())
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=g)


# ---------------------------------------------------------------------------- scenarios
def nan_at_step3(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    import torch_sentinel

    model, opt = _ddp()
    gate: Gate = model.module.gate
    sentinel = torch_sentinel.attach(model, opt, log_dir=kw["log_dir"], check=kw["check"], flush_every=2)
    result["module_names"] = sentinel.context.module_names
    if kw.get("lag"):
        sentinel._ranks.lag = kw["lag"]  # accelerators read one point later: that path, on CPU
    try:
        for step in range(8):
            x = _batch(rank, step)
            if rank == 1 and step == 3 and kw["where"] == "data":
                x[0, 0] = float("nan")
            gate.scale = float("inf") if rank == 1 and step == 3 and kw["where"] == "forward" else 1.0
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            result["last_step"] = step
    except torch_sentinel.NonFiniteError as err:
        result.update(raised=True, step=err.step, rank_blamed=err.rank, boundary=err.boundary,
                      module=err.module, message=str(err), at=sentinel.step)
    report = sentinel.report()
    result["report_kinds"] = sorted(report.kinds())
    result["report_ranks"] = sorted({f.rank for f in report.findings if f.rank is not None})
    sentinel.detach()


def healthy(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    import torch_sentinel
    from torch_sentinel.testing import count_host_syncs

    def loop(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> int:
        with count_host_syncs() as syncs:
            for step in steps:
                opt.zero_grad()
                model(_batch(rank, step)).pow(2).mean().backward()
                opt.step()
        return syncs.count

    model, opt = _ddp()
    loop(model, opt, range(2))  # DDP's first steps do one-off work (bucket rebuild)
    result["bare_syncs"] = loop(model, opt, range(2, 5))
    sentinel = torch_sentinel.attach(model, opt, log_dir=kw["log_dir"], check="deferred",
                                     flush_every=1000, per_rank_logs=kw["per_rank"])
    loop(model, opt, range(5, 7))
    result["sentinel_syncs"] = loop(model, opt, range(7, 10))
    report = sentinel.report()
    result["ok"] = report.ok
    result["findings"] = [str(f) for f in report.findings]
    sentinel.detach()


def gather(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    from torch_sentinel._distributed import gather_findings
    from torch_sentinel._findings import Finding

    own = [Finding(kind=f"only_on_rank{rank}", boundary="curves", message="m", rank=rank),
           Finding(kind="everywhere", boundary="data", message="m", rank=rank)]
    merged = gather_findings(own)
    result["kinds"] = sorted(f.kind for f in merged)


def fsdp_norms(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    """FSDP2: norms recorded from local shards must equal the full-parameter norms."""
    import copy

    from torch.distributed.fsdp import fully_shard

    import torch_sentinel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    sentinel = torch_sentinel.attach(model, opt, check="deferred", update_every=1, flush_every=1000)
    recorded: list[dict[str, Any]] = []
    expected: list[dict[str, dict[str, float]]] = []
    for step in range(3):
        xs = [_batch(r, step) for r in range(WORLD)]
        opt.zero_grad()
        model(xs[rank]).pow(2).mean().backward()
        opt.step()
        # Reference: the whole batch on full parameters (FSDP averages the ranks' gradients).
        before = {n: p.detach().clone() for n, p in reference.named_parameters()}
        ref_opt.zero_grad()
        torch.stack([reference(x).pow(2).mean() for x in xs]).mean().backward()
        grads = {n: float(p.grad.norm()) for n, p in reference.named_parameters()}
        ref_opt.step()
        expected.append({
            "grad_norm": grads,
            "param_norm": {n: float(p.norm()) for n, p in before.items()},  # weights the step found
            "update_norm": {n: float((p.detach() - before[n]).norm()) for n, p in reference.named_parameters()},
        })
    sentinel.flush()
    for rec in sentinel.recent_records():
        recorded.append({b: rec.mapping(b) for b in ("grad_norm", "param_norm", "update_norm")})
    result["recorded"] = recorded
    result["expected"] = expected
    result["local_shape"] = list(model[0].weight.to_local().shape)
    report = sentinel.report()
    result["ok"] = report.ok
    result["findings"] = [str(f) for f in report.findings]
    sentinel.detach()

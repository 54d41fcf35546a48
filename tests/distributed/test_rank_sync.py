"""Rank-consistent raise, DDP naming, rank-0 logging and cross-rank reports on 2 real gloo ranks."""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _worker(rank: int, port: int, out: str, plan: list[tuple[str, str, dict[str, Any]]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results: dict[str, Any] = {}
    try:
        for name, scenario, kwargs in plan:
            result: dict[str, Any] = {"rank": rank}
            results[name] = result
            try:
                SCENARIOS[scenario](rank, result, kwargs)
            except BaseException:
                result["crash"] = traceback.format_exc()
                break  # the other rank may now wait in a collective; stop here
            dist.barrier()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def run_ranks(out: Path, plan: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run the plan's scenarios in order on WORLD spawned gloo ranks; one spawn for all, since
    starting two interpreters that import torch is what costs the seconds here."""
    ctx = mp.start_processes(_worker, args=(_free_port(), str(out), plan),
                             nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"ranks hung for {TIMEOUT_S}s (a rank waits on a collective)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _ddp(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.parallel.DistributedDataParallel(Net())
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=g)


# ---------------------------------------------------------------------------- scenarios
def _nan_at_step3(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
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


def _healthy(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
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


def _gather(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
    from torch_sentinel._distributed import gather_findings
    from torch_sentinel._findings import Finding

    own = [Finding(kind=f"only_on_rank{rank}", boundary="curves", message="m", rank=rank),
           Finding(kind="everywhere", boundary="data", message="m", rank=rank)]
    merged = gather_findings(own)
    result["kinds"] = sorted(f.kind for f in merged)


def _fsdp_norms(rank: int, result: dict[str, Any], kw: dict[str, Any]) -> None:
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


SCENARIOS: dict[str, Callable[[int, dict[str, Any], dict[str, Any]], None]] = {
    "nan_at_step3": _nan_at_step3,
    "healthy": _healthy,
    "gather": _gather,
    "fsdp_norms": _fsdp_norms,
}


# ---------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ranks")
    plan = [
        ("nan-batch-immediate", "nan_at_step3",
         {"log_dir": str(root / "nan-batch"), "check": "immediate", "where": "data"}),
        ("inf-forward-deferred", "nan_at_step3",
         {"log_dir": str(root / "inf-forward"), "check": "deferred", "where": "forward"}),
        ("nan-batch-lagged", "nan_at_step3",
         {"log_dir": str(root / "nan-lagged"), "check": "deferred", "where": "data", "lag": 1}),
        ("rank0-only", "healthy", {"log_dir": str(root / "rank0-only"), "per_rank": False}),
        ("per-rank", "healthy", {"log_dir": str(root / "per-rank"), "per_rank": True}),
        ("gather", "gather", {}),
        ("fsdp", "fsdp_norms", {}),
    ]
    per_rank = run_ranks(root, plan)
    return {"root": root, **{name: [r.get(name, {}) for r in per_rank] for name, _, _ in plan}}


def _results(runs: dict[str, Any], name: str) -> list[dict[str, Any]]:
    results = runs[name]
    for r in results:
        assert r, f"scenario {name} did not run (an earlier one crashed)"
        assert "crash" not in r, r["crash"]
    return results


@pytest.mark.parametrize(
    ("name", "boundary", "module"),
    [("nan-batch-immediate", "data", None), ("inf-forward-deferred", "forward", "gate")],
    ids=["nan-batch-immediate", "inf-forward-deferred"],
)
def test_every_rank_raises_at_the_faulty_step(runs: dict[str, Any], name: str, boundary: str,
                                             module: Any) -> None:
    for r in _results(runs, name):
        assert r.get("raised"), f"rank {r['rank']} did not raise: {r}"
        assert r["step"] == 3
        assert r["at"] == 4  # both raised at step 4's training forward (the next lockstep point)
        assert r["last_step"] == 3
        assert r["rank_blamed"] == 1
        assert r["boundary"] == boundary
        assert r["module"] == module
        assert "on rank 1" in r["message"].splitlines()[0]
        assert not any(n.startswith("module") for n in r["module_names"])
        assert "gate" in r["module_names"]
        assert "non_finite" in r["report_kinds"] and r["report_ranks"] == [1]


def test_the_accelerator_read_path_raises_one_point_later_naming_the_same_step(runs: dict[str, Any]) -> None:
    # The agreement issued at step 4's forward is read at step 5's (its copy has landed there).
    for r in _results(runs, "nan-batch-lagged"):
        assert r.get("raised") and r["step"] == 3 and r["rank_blamed"] == 1 and r["boundary"] == "data"
        assert r["at"] == 5 and r["last_step"] == 4


@pytest.mark.parametrize("name", ["nan-batch-immediate", "rank0-only"], ids=["faulty", "healthy"])
def test_only_rank0_writes_logs_by_default(runs: dict[str, Any], name: str) -> None:
    _results(runs, name)
    logs = runs["root"] / ("nan-batch" if name == "nan-batch-immediate" else name)
    written = sorted(p.name for p in logs.iterdir())
    assert written and not any(n.startswith("rank") for n in written)


def test_per_rank_logs_write_one_run_per_rank(runs: dict[str, Any]) -> None:
    _results(runs, "per-rank")
    logs = runs["root"] / "per-rank"
    assert sorted(p.name for p in logs.iterdir()) == ["rank0", "rank1"]
    assert all(any((logs / d).iterdir()) for d in ("rank0", "rank1"))


@pytest.mark.parametrize("name", ["rank0-only", "per-rank"], ids=["rank0-only", "per-rank"])
def test_healthy_ddp_is_quiet_and_adds_no_host_reads(runs: dict[str, Any], name: str) -> None:
    for r in _results(runs, name):
        assert r["ok"], r["findings"]
        assert r["sentinel_syncs"] == r["bare_syncs"]


def test_report_gathers_findings_from_every_rank(runs: dict[str, Any]) -> None:
    for r in _results(runs, "gather"):
        assert r["kinds"] == ["everywhere", "only_on_rank0", "only_on_rank1"]


def test_fsdp2_norms_equal_full_parameter_norms(runs: dict[str, Any]) -> None:
    for r in _results(runs, "fsdp"):
        assert r["local_shape"] == [8, 8]  # each rank really holds half of fc1.weight
        assert r["ok"], r["findings"]
        assert len(r["recorded"]) == len(r["expected"]) == 3
        for got, want in zip(r["recorded"], r["expected"]):
            for block in ("grad_norm", "param_norm", "update_norm"):
                assert got[block].keys() == want[block].keys()
                for name, value in want[block].items():
                    assert got[block][name] == pytest.approx(value, rel=1e-4, abs=1e-6), (block, name)

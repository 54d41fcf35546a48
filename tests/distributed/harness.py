"""One spawn of real gloo ranks for a plan of scenarios, shared by the distributed tests.

Each rank runs the plan's scenarios in order and writes what it saw to ``rank{r}.json``; the
tests assert on those files. Starting interpreters that import torch is what costs the seconds,
so a test module spawns once for all its scenarios.

Two things here exist because gloo can kill a process from C++ with SIGABRT:

* each rank's stderr goes to ``rank{r}.log``, so that a rank that dies that way leaves gloo's
  message for the failure instead of a bare signal name;
* the results are written before the process group is torn down, and teardown does not go
  through the interpreter's finalisation (C++ destructors of objects that still hold the group
  run there, racing gloo's threads). A rank that still aborts after every rank wrote its results
  cannot have changed them, so the run stands, with a warning that carries the logs; an abort
  before that fails the run with the logs.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import importlib
import json
import os
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

Scenario = Callable[[int, dict[str, Any], dict[str, Any]], None]
#: (result name, scenario as "module:function" or a name in the default module, its keywords)
Plan = list[tuple[str, str, dict[str, Any]]]

#: gloo's own timeout in the workers: a rank left alone in a collective raises after this long.
COLLECTIVE_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scenario(ref: str, default_module: str) -> Scenario:
    module, _, function = ref.rpartition(":")
    return getattr(importlib.import_module(module or default_module), function)


def _run_plan(rank: int, plan: Plan, default_module: str, results: dict[str, Any]) -> bool:
    """Whether every scenario ran to its end."""
    for name, ref, kwargs in plan:
        result: dict[str, Any] = {"rank": rank}
        results[name] = result
        started = time.perf_counter()
        try:
            _scenario(ref, default_module)(rank, result, kwargs)
            result["seconds"] = round(time.perf_counter() - started, 2)
        except BaseException:
            result["crash"] = traceback.format_exc()
            return False  # the other ranks may now wait in a collective; stop here
        dist.barrier()
    return True


def _worker(rank: int, world: int, port: int, out: str, plan: Plan, default_module: str) -> None:
    log = open(Path(out, f"rank{rank}.log"), "w")  # noqa: SIM115 (fd 2 points at it until exit)
    os.dup2(log.fileno(), 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    results: dict[str, Any] = {}
    finished = False
    try:
        finished = _run_plan(rank, plan, default_module, results)
    finally:
        partial = Path(out, f"rank{rank}.json.partial")
        partial.write_text(json.dumps(results))
        partial.replace(Path(out, f"rank{rank}.json"))  # whole or absent, never half written
    if finished:
        dist.barrier()  # no rank tears down while another still talks to it
    gc.collect()  # DDP reducers and FSDP states in reference cycles hold the group: free them now
    dist.destroy_process_group()
    atexit._run_exitfuncs()  # what a normal exit would flush, while everything is still alive
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _logs(out: Path, world: int) -> str:
    parts = []
    for r in range(world):
        path = out / f"rank{r}.log"
        text = path.read_text(errors="replace").strip() if path.exists() else ""
        parts.append(f"--- rank {r} stderr (last 3000 characters) ---\n{text[-3000:] or '(empty)'}")
    return "\n".join(parts)


def run_ranks(out: Path, plan: Plan, *, world: int, timeout_s: float,
              default_module: str = "") -> list[dict[str, Any]]:
    """Run ``plan`` in order on ``world`` spawned gloo ranks and return each rank's results.

    A rank still running after ``timeout_s`` is killed and the run fails (TimeoutError); a rank
    that dies or raises before every rank has written its results fails it (RuntimeError); both
    carry the ranks' stderr. A scenario that raises does not fail the run: its traceback is in
    its result (``completed`` asserts on it)."""
    ctx = mp.start_processes(_worker, args=(world, free_port(), str(out), plan, default_module),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks hung for {timeout_s}s (a rank waits on a collective)\n"
                                   + _logs(out, world))
    except ProcessException as err:
        if not all((out / f"rank{r}.json").exists() for r in range(world)):
            raise RuntimeError(f"{err} before every rank wrote its results\n{_logs(out, world)}") from err
        warnings.warn(f"{err} in teardown, after every rank wrote its results\n{_logs(out, world)}",
                      RuntimeWarning, stacklevel=2)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def by_name(per_rank: list[dict[str, Any]], plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Each scenario's results, one per rank ({} where a rank never reached it)."""
    return {name: [r.get(name, {}) for r in per_rank] for name, _, _ in plan}


def completed(runs: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Scenario ``name``'s results on every rank, failing with the traceback of a rank that crashed."""
    results: list[dict[str, Any]] = runs[name]
    for r in results:
        assert r, f"scenario {name} did not run (an earlier one crashed)"
        assert "crash" not in r, r["crash"]
    return results

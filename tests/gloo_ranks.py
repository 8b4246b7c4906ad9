"""Spawned gloo ranks for the distributed tests (tests/test_data_parallel.py, tests/test_sharded.py).

A worker ``run(rank, world, port, out)`` joins the group with :func:`gloo_group` (one torch thread
per process) and saves each scenario's result, or the error it raised, with :func:`record`;
:func:`run_ranks` spawns the ranks and returns ``{scenario: [result of rank 0, rank 1, …]}``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import traceback
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int, timeout_s: float) -> Iterator[None]:
    """This process as ``rank`` of a gloo group on localhost, one torch thread; destroyed on exit."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        dist.destroy_process_group()


def record(out: Path, name: str, rank: int, fn: Callable[[], object]) -> None:
    """Save ``{"ok": fn()}`` or the error ``fn`` raised (type, message, traceback) as ``out/<name>-<rank>.pt``."""
    try:
        result = {"ok": fn()}
    except Exception as exc:  # the test inspects the error each rank raised
        result = {"error": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()}
    torch.save(result, Path(out) / f"{name}-{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Callable[[int, int, int, str], None], out: Path, world: int = WORLD) -> dict[str, list[dict]]:
    """Spawn ``world`` processes of ``worker`` and return every scenario's results by rank."""
    mp.start_processes(worker, args=(world, _free_port(), str(out)), nprocs=world, join=True, start_method="spawn")
    names = {p.name.rsplit("-", 1)[0] for p in Path(out).glob("*.pt")}
    return {n: [torch.load(Path(out) / f"{n}-{r}.pt", weights_only=False) for r in range(world)] for n in names}

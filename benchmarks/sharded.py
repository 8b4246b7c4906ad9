"""Sharded curvature (FSDP2, issue #27): N gloo ranks against one process, per-rank memory against the plan.

``python -m benchmarks.sharded [--shape pythia-410m] [--ranks 2] [--probes 4] [--steps 6] [--json PATH]``
(also ``losslens bench sharded``; ``--project`` adds the 8 × 80 GB projection rows).

Model: a random-init GPT-NeoX of the shape (``benchmarks.shapes.SHAPES``), float32, every decoder
block and the root ``fully_shard``-ed on a 1-D CPU mesh (:func:`losslens.lm.models.sharding.shard_model`);
curvature data: 2 batches of 2 × 64 random tokens, split over the ranks. Each process runs one
torch thread. For 1 rank and for N ranks (``torch.multiprocessing`` spawn, gloo), each rank runs
Hutchinson (``--probes`` probes) and Lanczos (``--steps`` steps) on a
:class:`~losslens.geometry.operators.sharded.ShardedHessianOperator` and records:

- the estimates (every rank's are equal; N ranks against 1: float32 summation order);
- ``peak_tracked``: the peak of tensors allocated during the estimator call
  (:func:`losslens.geometry.memory.graphs.peak_new_bytes`: vectors, estimator state, master copy, the pass),
  the largest over the ranks; ``plan``: the estimator's predicted bytes; their ratio;
- ``state``: the plan's vector parts (the estimator's own state), which shard as 1/N.

``--project``: per-rank memory of sharded Hutchinson / Lanczos on OLMo-2-7B and a 32B shape
(OLMo-2-0325-32B: hidden 5120, 64 layers, 40 heads, MLP 27648, vocabulary 100,352) over 8 GPUs of
80 GB, bfloat16 weights and master copy, float32 vectors, one sequence of 2048 tokens with
activation checkpointing (see :func:`project`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.scale_projection import sharded_project as project  # the per-rank projection

ROWS, SEQ, BATCHES = 2, 64, 2


def _rank(rank: int, world: int, port: int, out: str, shape: str, probes: int, steps: int) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=1800))
    try:
        from benchmarks.shapes import SHAPES, build
        from losslens.geometry import hutchinson_trace, top_eigenvalues
        from losslens.geometry.memory.graphs import peak_new_bytes
        from losslens.geometry.operators.data_parallel import split_batches
        from losslens.geometry.operators.data_parallel import DataParallel
        from losslens.lm.models.lm_setup import plan_lm_setup
        from losslens.lm.models.sharding import shard_model, sharded_lm_hessian

        model = shard_model(build(shape, torch.float32), "cpu")
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, SHAPES[shape][4], (ROWS, SEQ), generator=g) for _ in range(BATCHES)]
        mine = split_batches(batches, rank, world)
        setup = plan_lm_setup(model, mine, backend="difference", lean_head=False, data_parallel=DataParallel())
        op = sharded_lm_hessian(model, setup, max_memory=64 * 10**9)
        op.pass_bytes(1)  # measured once, outside the tracked calls
        rows = {}
        for name, call in (
            ("hutchinson", lambda: hutchinson_trace(op, num_matvecs=probes, seed=0, block_size=1)),
            ("lanczos", lambda: top_eigenvalues(op, k=1, method="lanczos", max_iter=steps, seed=0)),
        ):
            t0 = time.perf_counter()
            res, peak = peak_new_bytes(call)
            value = res.value if name == "hutchinson" else res.values[0]
            mem = res.memory
            state = sum(v for k, v in mem["parts"].items() if "dim" in k)
            peaks = op.parallel.gather_objects(int(peak))
            rows[name] = {
                "value": value,
                "peak_tracked": max(peaks),
                "plan": mem["predicted_bytes"],
                "state": state,
                "parts": mem["parts"],
                "seconds": time.perf_counter() - t0,
                "elements": op.local_dim,
                "dim": op.global_dim,
            }
        if rank == 0:
            torch.save(rows, Path(out) / f"world{world}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(shape: str = "pythia-410m", ranks: int = 2, probes: int = 4, steps: int = 6) -> list[dict]:
    """Rows for 1 rank and ``ranks`` ranks (see the module docstring)."""
    import torch.multiprocessing as mp

    out_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, ranks):
            mp.start_processes(
                _rank,
                args=(world, _free_port(), tmp, shape, probes, steps),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
        one, many = (torch.load(Path(tmp) / f"world{w}.pt") for w in (1, ranks))
    for name in ("hutchinson", "lanczos"):
        for world, res in ((1, one[name]), (ranks, many[name])):
            out_rows.append(
                {
                    "shape": shape,
                    "estimator": name,
                    "ranks": world,
                    "value": res["value"],
                    "rel_diff_vs_1": abs(res["value"] - one[name]["value"]) / abs(one[name]["value"]),
                    "elements_per_rank": res["elements"],
                    "state_GB": res["state"] / 1e9,
                    "peak_tracked_GB": res["peak_tracked"] / 1e9,
                    "plan_GB": res["plan"] / 1e9,
                    "measured_over_plan": res["peak_tracked"] / res["plan"],
                    "seconds": res["seconds"],
                    "threads_per_process": 1,
                }
            )
    return out_rows


def run(
    quick: bool = False,
    shape: str | None = None,
    ranks: int = 2,
    probes: int | None = None,
    steps: int | None = None,
    with_projection: bool = True,
) -> list[dict]:
    shape = shape or ("pythia-14m" if quick else "pythia-410m")
    rows = measure(shape, ranks, probes or (2 if quick else 4), steps or (3 if quick else 6))
    return rows + (project() if with_projection else [])


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks import emit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shape", default=None)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--probes", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--project", action="store_true", help="only the 8 x 80 GB projection rows")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = project() if args.project else run(args.quick, args.shape, args.ranks, args.probes, args.steps)
    return emit(rows, args.json)


if __name__ == "__main__":
    main()

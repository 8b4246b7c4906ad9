"""Data-parallel speed-up: one process over B batches vs N gloo ranks over B/N each (issue #26).

``python -m benchmarks.data_parallel [--quick] [--ranks 2] [--json PATH]``

Model: the randomly initialised GPT-NeoX of ``benchmarks.hvp_throughput`` (``--size 1M``: hidden 128,
4 layers, vocab 512; float32, eager attention), curvature batches of 4 × 128 tokens (``--batches``
of them, default 4), every parameter. Every process runs **one torch thread** (``torch.set_num_threads(1)``
in each spawned process, before any work), so N ranks use N cores; the comparison is then the
speed-up that N devices give, not a change of thread count.

Rows, for 1 process and for N ranks (``torch.multiprocessing`` spawn, gloo, one process group):
- ``matmat``: seconds of one ``HessianOperator.matmat`` of k = 8 vectors (graphs rebuilt: no cache),
  the median of ``--repeats`` calls after one warm-up;
- ``hutchinson``: seconds of ``hutchinson_trace(op, num_matvecs=16)``, and its value;
- ``speedup`` = seconds(1 process) ÷ seconds(N ranks); ``rel_diff``: the N-rank result against the
  one-process result (products: ‖ΔHV‖/‖HV‖; trace: |Δ|/|tr|), float32 summation order only.
The run must have the machine to itself (other jobs on the cores distort the ratio).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch

K = 8


def _batches(n: int, vocab: int, rows: int, seq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (rows, seq), generator=g) for _ in range(n)]


def _measure(rank: int, world: int, port: int, out: str, size: str, n_batches: int, repeats: int, seq: int) -> None:
    """One rank (or the single process when world = 1): time matmat and Hutchinson, save to ``out``."""
    torch.set_num_threads(1)
    from benchmarks.hvp_models import SIZES, build_model
    from losslens.geometry import HessianOperator, hutchinson_trace
    from losslens.geometry.operators.data_parallel import split_batches
    from losslens.lm.core.next_token_loss import lm_loss

    parallel = world > 1
    if parallel:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    try:
        model = build_model("neox", size)
        batches = _batches(n_batches, SIZES[size]["vocab"], 4, seq)
        mine = split_batches(batches, rank, world)
        op = HessianOperator(model, lm_loss, mine, data_parallel=parallel, max_memory="8GB")
        V = torch.randn(K, op.dim, generator=torch.Generator().manual_seed(1))
        op.matmat_flat(V)  # warm-up
        times = []
        for _ in range(repeats):
            if parallel:
                dist.barrier()
            t0 = time.perf_counter()
            hv = op.matmat_flat(V)
            times.append(time.perf_counter() - t0)
        if parallel:
            dist.barrier()
        t0 = time.perf_counter()
        tr = hutchinson_trace(op, num_matvecs=16, seed=0)
        t_tr = time.perf_counter() - t0
        if rank == 0:
            torch.save(
                {"matmat_s": statistics.median(times), "hv": hv, "trace_s": t_tr, "trace": tr.value, "dim": op.dim},
                Path(out) / f"world{world}.pt",
            )
    finally:
        if parallel:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    quick: bool = False, ranks: int = 2, size: str = "1M", n_batches: int | None = None, repeats: int | None = None
) -> list[dict]:
    """Rows for 1 process and ``ranks`` ranks (see the module docstring)."""
    import torch.multiprocessing as mp

    n_batches = n_batches or (2 if quick else 4)
    repeats = repeats or (1 if quick else 3)
    seq = 64 if quick else 128
    if n_batches < ranks:
        raise ValueError(f"--batches ({n_batches}) must be at least --ranks ({ranks})")
    with tempfile.TemporaryDirectory() as tmp:
        _measure(0, 1, 0, tmp, size, n_batches, repeats, seq)
        mp.start_processes(
            _measure,
            args=(ranks, _free_port(), tmp, size, n_batches, repeats, seq),
            nprocs=ranks,
            join=True,
            start_method="spawn",
        )
        one = torch.load(Path(tmp) / "world1.pt")
        many = torch.load(Path(tmp) / f"world{ranks}.pt")
    common = {"model": f"neox-{size}", "dim": one["dim"], "batches": f"{n_batches}x4x{seq}", "threads_per_process": 1}
    hv_diff = float((many["hv"] - one["hv"]).norm() / one["hv"].norm())
    return [
        {
            **common,
            "measure": f"matmat k={K}",
            "s_1_process": one["matmat_s"],
            f"s_{ranks}_ranks": many["matmat_s"],
            "speedup": one["matmat_s"] / many["matmat_s"],
            "rel_diff": hv_diff,
        },
        {
            **common,
            "measure": "hutchinson 16 HVPs",
            "s_1_process": one["trace_s"],
            f"s_{ranks}_ranks": many["trace_s"],
            "speedup": one["trace_s"] / many["trace_s"],
            "rel_diff": abs(many["trace"] - one["trace"]) / abs(one["trace"]),
        },
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks import emit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="1M")
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    return emit(run(args.quick, args.ranks, args.size, args.batches, args.repeats), args.json)


if __name__ == "__main__":
    main()

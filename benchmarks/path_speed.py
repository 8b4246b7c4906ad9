"""Products per second of the one-process and data-parallel paths, two code trees compared (issue #48:
"nothing about the 1-process and data-parallel paths gets slower").

``python -m benchmarks.path_speed --tree before=/tmp/old --tree after=/tmp/new [--rounds 5] [--json PATH]``

Each ``--tree NAME=FOLDER`` is a checkout of this repository (``git worktree add FOLDER COMMIT``),
imported as ``losslens`` through a folder of links (its ``probes/`` entries, ``geometry/`` as
``losslens.geometry``) put first on ``PYTHONPATH``, so the trees run the same benchmark code. Every
measurement is a fresh process (``--worker``): the random-init Pythia-160m shape
(``benchmarks.shapes.build``, float32, seed 0), :data:`BATCHES` batches of 1 × :data:`SEQ` random
tokens, :class:`losslens.geometry.HessianOperator` with the ``--backend`` (default: reverse, then
difference), one warm-up product, then :data:`PRODUCTS` products of one vector timed; products per
second = products / seconds. ``1-process``: one process over every batch, pinned to CPU 0;
``data-parallel``: 2 gloo ranks (``data_parallel=True``), one batch each, rank r pinned to CPU r,
a barrier before and after the timed products. One torch thread per process. Within a round the
trees run in turn, their order alternating from round to round (before, after; after, before; ...),
so drift of a shared machine falls on both; reported per (path, backend): each tree's median
products/s and the ratio after ÷ before per round (median, min, max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = "pythia-160m"
#: curvature batches (one per rank on the data-parallel path) of 1 × SEQ tokens
BATCHES, SEQ = 2, 64
#: products timed per measurement, after one warm-up product
PRODUCTS = 3
PATHS = ("1-process", "data-parallel")


def _link_tree(tree: Path, into: Path) -> Path:
    """A folder holding ``losslens`` as links into ``tree`` (``probes/*`` and ``geometry``)."""
    pkg = into / "losslens"
    pkg.mkdir(parents=True)
    for entry in (tree / "probes").iterdir():
        (pkg / entry.name).symlink_to(entry)
    (pkg / "geometry").symlink_to(tree / "geometry")
    return into


def _measure(rank: int, world: int, port: int, backend: str, shape: str, out: str) -> None:
    """One process of a measurement: pinned to CPU ``rank``, one thread; rank 0 writes the rate."""
    import datetime

    import torch

    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    parallel = world > 1
    if parallel:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=900))
    try:
        import losslens.geometry
        from benchmarks.shapes import SHAPES, build
        from losslens.geometry import HessianOperator
        from losslens.lm.core.next_token_loss import lm_loss

        model = build(shape, torch.float32)
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, SHAPES[shape][4], (1, SEQ), generator=g) for _ in range(BATCHES)]
        mine = batches[rank::world]
        op = HessianOperator(model, lm_loss, mine, backend=backend, **({"data_parallel": True} if parallel else {}))
        v = torch.randn(1, op.dim, generator=torch.Generator().manual_seed(1))
        op.matmat_flat(v)  # warm-up
        if parallel:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(PRODUCTS):
            op.matmat_flat(v)
        if parallel:
            dist.barrier()
        seconds = time.perf_counter() - t0
        if rank == 0:
            where = str(Path(losslens.geometry.__file__).resolve().parent)
            Path(out).write_text(json.dumps({"seconds": seconds, "rate": PRODUCTS / seconds, "geometry": where}))
    finally:
        if parallel:
            dist.destroy_process_group()


def _worker(path: str, backend: str, shape: str, out: str) -> None:
    if path == "1-process":
        _measure(0, 1, 0, backend, shape, out)
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_measure, args=(2, port, backend, shape, out), nprocs=2, join=True, start_method="spawn")


def _one(site: Path, path: str, backend: str, shape: str) -> dict:
    """One measurement in a fresh process importing ``losslens`` from ``site``."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rate.json"
        env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "benchmarks.path_speed", "--worker", path, backend, shape, str(out)]
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def run(
    trees: dict[str, str], rounds: int = 5, backends: tuple[str, ...] = ("reverse", "difference"), shape: str = SHAPE
) -> list[dict]:
    """Rows per (path, backend): each tree's median products/s over ``rounds`` and, for two trees, the
    per-round ratio second ÷ first (median, min, max)."""
    names = list(trees)
    rates: dict[tuple, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sites = {n: _link_tree(Path(t).resolve(), Path(tmp) / n) for n, t in trees.items()}
        for i in range(rounds):
            for path in PATHS:
                for backend in backends:
                    for name in names if i % 2 == 0 else names[::-1]:
                        got = _one(sites[name], path, backend, shape)
                        if not got["geometry"].startswith(str(Path(trees[name]).resolve())):
                            raise RuntimeError(f"tree {name} imported {got['geometry']}")
                        rates.setdefault((path, backend, name), []).append(got["rate"])
                        print(json.dumps({"round": i, "path": path, "backend": backend, "tree": name, **got}))
    rows = []
    for path in PATHS:
        for backend in backends:
            row = {"shape": shape, "tokens": f"{BATCHES}x1x{SEQ}", "path": path, "backend": backend, "rounds": rounds}
            for name in names:
                row[f"{name}_products_per_s"] = statistics.median(rates[(path, backend, name)])
            if len(names) == 2:
                a, b = (rates[(path, backend, n)] for n in names)
                ratios = [y / x for x, y in zip(a, b)]
                row.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(*argv[1:5])
        return []
    from benchmarks import emit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=FOLDER (a checkout); repeat")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="reverse,difference")
    parser.add_argument("--shape", default=SHAPE, help="a benchmarks.shapes name")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    return emit(run(trees, args.rounds, tuple(args.backends.split(",")), args.shape), args.json)


if __name__ == "__main__":
    main()

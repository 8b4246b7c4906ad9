"""Trajectory PCA at a real shape: peak memory against its plan (issue #38).

``python -m benchmarks.landscape [--shape pythia-70m] [--n 20] [--dtype float32] [--max-memory 2GB] [--dir DIR]``

Writes N checkpoints of a random-init model of the shape (a random walk from one initialisation:
θ_i = θ_{i−1} + 1e-3·σ·ξ per tensor, σ its standard deviation; safetensors, as ``save_pretrained``
writes them) into DIR (kept and reused), then, in a fresh process per row with ``--strict-memory``'s
allocator setting (glibc mmap threshold 64 kB), loads the model once (the resident baseline),
resets the kernel's peak (``/proc/self/clear_refs``) and runs
:func:`losslens.geometry.surfaces.trajectory_pca.trajectory_pca` over the N checkpoints through
:func:`losslens.study.landscape.sources.checkpoint_source` (positioned reads). The row reports the peak
resident memory above the baseline (``VmHWM``) divided by the plan
(:func:`losslens.geometry.surfaces.trajectory_pca.estimate_memory`), and the seconds. Threads: 2
(``torch.set_num_threads``
in the child; the parent only writes files).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.shapes import SHAPES, build


def prepare(folder: Path, shape: str, n: int, dtype: torch.dtype) -> Path:
    """N checkpoints ``step-XXXXXX`` of the shape in ``folder`` (reused when complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"{shape}-{n}-{str(dtype).split('.')[-1]}.done"
    if done.exists():
        return folder
    model = build(shape, dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        sigma = {k: float(p.float().std()) if p.numel() > 1 else 1.0 for k, p in model.named_parameters()}
        for i in range(n):
            for k, p in model.named_parameters():
                p.add_(1e-3 * sigma[k] * torch.randn(p.shape, generator=gen).to(p.dtype))
            model.save_pretrained(folder / f"step-{(i + 1) * 100:06d}", safe_serialization=True)
    done.write_text("ok")
    return folder


def child(folder: str, max_memory: str, k: int) -> dict:
    """One measured run in this (fresh) process."""
    from benchmarks.scale import _reset_peak, _rss
    from losslens.geometry.memory.allocator import STRICT_MMAP_THRESHOLD, return_freed_memory, trim
    from losslens.geometry.surfaces.trajectory_pca import estimate_memory, trajectory_pca
    from losslens.lm.checkpoints import CheckpointLoader, Trajectory
    from losslens.study.landscape.sources import checkpoint_source

    return_freed_memory(STRICT_MMAP_THRESHOLD)
    torch.set_num_threads(2)
    traj = Trajectory.from_folder(folder)
    model = CheckpointLoader(traj).load(traj[0])
    sources = [checkpoint_source(r, model) for r in traj]
    shapes = {n: sources[0].shape(n) for n in sources[0].names()}
    dtypes = {n: sources[0].dtype(n) for n in sources[0].names()}
    plan = estimate_memory(shapes, dtypes, len(sources), k, max_memory=max_memory)
    trim()
    _reset_peak()
    base, _ = _rss()
    t0 = time.perf_counter()
    res = trajectory_pca(sources, k=k, max_memory=max_memory)
    seconds = time.perf_counter() - t0
    _, peak = _rss()
    return {
        "n": len(sources),
        "dim": sum(t.numel() for t in res.center.values()),
        "k": k,
        "dtype": str(dtypes[next(iter(dtypes))]).split(".")[-1],
        "plan_bytes": plan.total,
        "peak_above_model_bytes": peak - base,
        "measured_over_plan": (peak - base) / plan.total,
        "seconds": seconds,
        "explained": [float(v) for v in res.explained_variance_ratio],
        "parts": plan.parts,
        "budget": plan.budget,
    }


def run(
    shape: str = "pythia-70m",
    n: int = 20,
    dtype: str = "float32",
    max_memory: str = "2GB",
    k: int = 2,
    folder: str | None = None,
) -> dict:
    """Prepare the checkpoints and measure one row in a child process."""
    folder = Path(folder or Path(tempfile.gettempdir()) / f"losslens-landscape-{shape}-{dtype}")
    prepare(folder, shape, n, getattr(torch, dtype))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.landscape",
            "--child",
            str(folder),
            "--max-memory",
            max_memory,
            "--k",
            str(k),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["shape"] = shape
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="pythia-70m", choices=sorted(SHAPES))
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--max-memory", default="2GB")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        row = child(a.child, a.max_memory, a.k)
    else:
        row = run(a.shape, a.n, a.dtype, a.max_memory, a.k, a.dir)
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()

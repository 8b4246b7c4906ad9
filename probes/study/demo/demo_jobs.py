"""The demo's heavy work, in worker processes (a :class:`~losslens.lm.core.workers.WorkerPool`) or in this
process: training the runs (one job per run) and drawing each run's quantization plane (one job per
plane); and, in this process, all runs in one principal plane (:func:`draw_landscape`). A job is a
module-level function so that a worker can import it."""

from __future__ import annotations

from pathlib import Path

from losslens.lm.core.worker_loop import WorkerError
from losslens.lm.core.workers import WorkerPool


def _train_job(context, run):
    """Train one run (its data cached in ``out/data``); a worker's job, or called in this process."""
    from losslens.lm.train.tiny import train_tiny

    settings, out, progress = context
    cfg, folder, mon = settings.train_config(run), out / "runs" / run.name, None
    if run.name == settings.monitor_run:  # watched live (losslens.study.monitor); the training is bit-identical
        from losslens.study.monitor.tiny_monitor import tiny_monitor

        mon = tiny_monitor(cfg, out / "monitor.sqlite", folder, out / "data", every=settings.monitor_every)
    try:
        return train_tiny(
            cfg, folder, progress=progress, data_dir=out / "data", on_step=None if mon is None else mon.step
        )
    finally:
        if mon is not None:
            mon.close()


def _surface_job(context, traj, path: str) -> str:
    """The quantization plane of a run's last checkpoint, saved to ``path``; a worker's job, or
    called in this process."""
    import torch

    from losslens.lm.checkpoints import CheckpointLoader
    from losslens.lm.quant.plane import quantization_surface

    settings, sets, progress = context
    real = traj.real
    with torch.no_grad():
        surf = quantization_surface(
            CheckpointLoader(traj),
            real[-1],
            real[-2],
            settings.headline_spec,
            sets,
            grid=settings.grid,
            progress=progress,
        )
    surf.save(path)
    return path


def _in_pool(pool: WorkerPool, jobs, context, what: list[str], echo) -> list:
    """Run ``jobs`` on ``pool``; the return values in job order (an error in any job is raised here)."""
    values: list = [None] * len(jobs)
    for ev in pool.run(jobs, context):
        if ev.kind in ("error", "lost"):
            raise WorkerError(f"{what[ev.job]} failed in a worker process: {ev.value}")
        if ev.kind == "done":
            values[ev.job] = ev.value
            echo(f"[demo] done: {what[ev.job]}")
    return values


def train_all(settings, out: Path, progress: bool, echo, pool) -> dict:
    from losslens.lm.train.tiny_data import prepare_data

    what = [
        f"training {run.name} ({settings.steps} steps, {settings.checkpoints} checkpoints)" for run in settings.runs
    ]
    if pool is None:
        trajectories = {}
        for run, msg in zip(settings.runs, what):
            echo(f"[demo] {msg}")
            trajectories[run.name] = _train_job((settings, out, progress), run)
        return trajectories
    first = settings.runs[0]
    prepare_data(settings.train_config(first), out / "runs" / first.name, out / "data")  # the shared cache, once
    echo(f"[demo] {'; '.join(what)}: on {pool.size} workers")
    trajs = _in_pool(pool, [(_train_job, (run,)) for run in settings.runs], (settings, out, False), what, echo)
    return {run.name: t for run, t in zip(settings.runs, trajs)}


def draw_planes(settings, trajectories: dict, sets: dict, out: Path, progress: bool, echo, pool) -> dict:
    """``{run: Surface}``: the quantization plane of each run's last checkpoint, drawn on ``pool``
    (or here) into ``out/surfaces/RUN.json`` unless a rerun finds it there."""
    from losslens.geometry.surfaces.surface import Surface

    (out / "surfaces").mkdir(exist_ok=True)
    paths = {run.name: out / "surfaces" / f"{run.name}.json" for run in settings.runs}
    todo = [run.name for run in settings.runs if not paths[run.name].is_file()]
    what = [
        f"quantization plane of {name} ({settings.grid}x{settings.grid}, {settings.headline_spec})" for name in todo
    ]
    if pool is not None and todo:
        echo(f"[demo] {'; '.join(what)}: on {pool.size} workers")
        _in_pool(
            pool,
            [(_surface_job, (trajectories[name], str(paths[name]))) for name in todo],
            (settings, sets, False),
            what,
            echo,
        )
    elif todo:
        for name, msg in zip(todo, what):
            echo(f"[demo] {msg}")
            _surface_job((settings, sets, progress), trajectories[name], str(paths[name]))
    return {run.name: Surface.load(paths[run.name]) for run in settings.runs}


def draw_landscape(settings, trajectories: dict, sets: dict, out: Path, progress: bool, echo, seconds: dict):
    """The runs in one principal plane (:func:`losslens.study.landscape.trajectory_landscape.trajectory_landscape`):
    every
    real checkpoint of every run, each one's ``headline_spec`` point projected onto the plane, the
    loss on a ``landscape_grid``² grid. The grid is resumable (``out/landscape/grid.npz``); the PCA,
    the quantized points and the marked points are recomputed on a rerun (seconds at the demo's size).
    Writes ``out/landscape/landscape.json`` (:meth:`~losslens.study.landscape.trajectory_landscape.Landscape.describe`);
    its time goes to ``seconds["landscape"]``. Returns the Landscape (None when ``landscape_grid`` is 0)."""
    import json
    import time

    import torch

    from losslens.geometry.base.progress import Progress
    from losslens.study.landscape.trajectory_landscape import trajectory_landscape

    if not settings.landscape_grid:
        return None
    t0 = time.perf_counter()
    folder = out / "landscape"
    folder.mkdir(exist_ok=True)
    runs = [trajectories[run.name] for run in settings.runs]
    echo(
        f"[demo] landscape of {len(runs)} runs in one principal plane ({settings.landscape_grid}x"
        f"{settings.landscape_grid}, {settings.headline_spec})"
    )
    with torch.no_grad():
        land = trajectory_landscape(
            runs,
            sets["eval"],
            spec=settings.headline_spec,
            grid=settings.landscape_grid,
            checkpoint_path=str(folder / "grid.npz"),
            progress=Progress(None, what="landscape", label="demo", quiet=not progress, live=False),  # [demo] lines
        )
    (folder / "landscape.json").write_text(json.dumps(land.describe(), indent=2))
    seconds["landscape"] = time.perf_counter() - t0
    return land

"""A sweep of one trajectory from settings objects (``losslens sweep``): every probe of a plan on every
checkpoint, into a resumable SQLite store.

:func:`run_trajectory_sweep` opens the trajectory, builds the plan (the built-in one, small with
``quick``, or a plan file; ``max_memory``, ``backend`` and ``compute_dtype`` given here override the
plan's) and runs :func:`losslens.study.sweep.executor.run_sweep`; :func:`sweep` is the same with the
CLI's options as keyword parameters (``losslens.sweep``), returning a JSON-ready summary. Imports torch
only when called.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import (
    ComputeOptions,
    LoadOptions,
    MemoryOptions,
    TrajectoryOptions,
    keywords,
    settings,
)


class SweepSettingsError(LosslensError, ValueError):
    """Sweep settings that contradict each other; the message says which and what to do."""


@settings
@dataclass(frozen=True)
class SweepSettings:
    """How ``losslens sweep`` runs: the store (``out``, created or resumed), the plan file (None: the
    built-in plan, smaller with ``quick``), the executor (``local`` worker processes or ``ray`` at
    ``address``) and its ``workers``, whether failed rows are rerun, a store of another plan is added
    to, and another sweep writing the store is waited for, a tidy ``export`` file (.csv/.parquet),
    ``quiet`` (no progress display) and ``run``: the trajectory's name in the store (None: the plan's
    name), so that several trajectories (forks of one base) share one store and its analyses."""

    out: Path = Path("results.sqlite")
    plan: Optional[Path] = None
    quick: bool = False
    executor: str = "local"
    address: Optional[str] = None
    num_workers: Optional[int] = None
    retry_failed: bool = False
    allow_mixed: bool = False
    wait: bool = False
    export: Optional[Path] = None
    quiet: bool = False
    run: Optional[str] = None


def run_trajectory_sweep(
    trajectory: str | Path,
    settings: SweepSettings = SweepSettings(),
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    compute: ComputeOptions = ComputeOptions(backend=None),
    on_row: Callable[[Any], None] | None = None,
    on_wait: Callable[[dict], None] | None = None,
    on_note: Callable[[str], None] | None = None,
):
    """Run the sweep; returns the :class:`~losslens.study.sweep.outcome.SweepReport`. ``compute.backend``
    None keeps the plan's backend. ``on_row`` sees every row written, ``on_wait`` the holder of the
    store's lock while waiting (``wait``), ``on_note`` a line on the LR schedule / tokens the checkpoints
    were given. Applies ``memory.strict_memory`` first. Raises :class:`SweepSettingsError`,
    ``PlanError``, ``StoreError``, ``SweepError``, ``DistributedError`` (all :class:`LosslensError`)
    before anything is run."""
    from losslens.lm.core.distributed import init_data_parallel, is_main_rank
    from losslens.study.sweep import Plan, SweepOptions, load_plan, resolve_trajectory, run_sweep

    s = settings
    if s.quick and s.plan is not None:
        raise SweepSettingsError(
            "--quick shrinks the built-in plan and cannot change a --plan file; drop --quick, or set "
            "smaller sizes in the plan ([data] shapes, trace.num_matvecs, eigen.max_iter)"
        )
    memory.apply()
    device = load.device
    if compute.parallel == "data":
        device = init_data_parallel(device=device, command="sweep")[2]
    dtype = load.torch_dtype()
    traj = resolve_trajectory(
        trajectory,
        cache_dir=source.cache_dir,
        schedule=source.schedule,
        tokens_per_step=source.tokens_per_step,
        sidecars=[Path(s.out).parent / "trajectory.json"],
    )
    sched, tps = traj.meta.get("schedule"), traj.meta.get("tokens_per_step")
    if (sched or tps) and is_main_rank() and on_note is not None:
        said = [f"LR from the schedule {sched}"] if sched else []
        said += [f"tokens = step × {tps}"] if tps else []
        on_note(f"{traj.name}: {'; '.join(said)}")
    run = SweepOptions(
        on_row=on_row,
        executor=s.executor,
        address=s.address,
        retry_failed=s.retry_failed,
        allow_mixed=s.allow_mixed,
        progress=not s.quiet,
        device=device,
        num_workers=s.num_workers,
        num_threads=compute.threads,
        wait=s.wait,
        on_wait=on_wait,
        allow_pickle=load.allow_pickle,
        dtype=dtype,
        parallel=compute.parallel,
        run=s.run,
    )
    p = Plan.default(quick=s.quick) if s.plan is None else load_plan(s.plan)
    if memory.max_memory is not None:
        p = p.replace(max_memory=memory.max_memory)
    if compute.backend is not None:
        p = p.replace(backend=compute.backend)
    if compute.compute_dtype is not None:
        p = p.replace(compute_dtype=compute.compute_dtype)
    report = run_sweep(traj, p, Path(s.out), run)
    if s.export is not None and is_main_rank():
        from losslens.study.sweep import Store

        with Store(Path(s.out)) as st:
            st.export(s.export)
    return report


def sweep_summary(report) -> dict:
    """A sweep report as JSON-ready data: the counts, failures (checkpoint, probe, spec, error), notes,
    ``exit_code`` (0 all ok, 1 some rows failed, 3 all failed) and the per-checkpoint / per-probe wall
    times in seconds."""
    from losslens.geometry.base.jsonable import jsonable

    out = jsonable(asdict(report))
    out["store"] = str(report.store)
    out["exit_code"] = report.exit_code
    return out


def _sweep(
    trajectory: str | Path,
    settings: SweepSettings = SweepSettings(),
    *,
    source: TrajectoryOptions = TrajectoryOptions(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    compute: ComputeOptions = ComputeOptions(backend=None),
) -> dict:
    report = run_trajectory_sweep(trajectory, settings, source=source, load=load, memory=memory, compute=compute)
    return sweep_summary(report)


sweep = keywords(
    _sweep,
    "sweep",
    """``sweep(trajectory, *, out="results.sqlite", plan=None, quick=False, ...)``: run every probe of a
    plan on every checkpoint of ``trajectory`` (a folder or ``hf:ORG/NAME@REVISIONS``) into the store
    ``out`` (resumable), with the CLI's options as keyword parameters; returns :func:`sweep_summary`
    (what ``losslens sweep --json`` prints). Read the rows with ``losslens.Store(out).results()``.""",
)

__all__ = ["SweepSettings", "SweepSettingsError", "run_trajectory_sweep", "sweep", "sweep_summary"]

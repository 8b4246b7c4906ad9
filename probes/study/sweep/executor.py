"""Running a plan over a trajectory: in-process or on Ray, every finished probe committed at once.

:func:`run_sweep` is the one entry point (the CLI's ``losslens sweep`` calls it)::

    from losslens.study.sweep import Plan, run_sweep
    report = run_sweep("runs/wsd", Plan.default(), out="wsd.sqlite")            # in-process
    report = run_sweep("runs/wsd", "plan.toml", out="wsd.sqlite", executor="ray",
                       address="auto")                                         # an existing cluster

Steps: resolve the trajectory (a folder → :meth:`Trajectory.from_folder`) and append the plan's LAWA
checkpoints; build the token sets once (:func:`losslens.lm.data.default_token_sets` with the plan's
shapes and seed, or the plan's saved files, or ``token_sets=``) and hash them; bind the store
(refusing another plan's store unless ``allow_mixed``); skip every row already ``ok`` with the same
settings (and ``failed`` rows unless ``retry_failed``); run the rest.

Executors
---------
``local``  checkpoints in trajectory order, on ``num_workers`` worker processes (default: one per
           core, each with one torch thread; 1 on CUDA or for a single checkpoint; see
           :mod:`losslens.study.sweep.local_workers`) or, with one worker, in this process. Each probe's row is written
           by
           this process (its own transaction) the moment it finishes, so a kill loses at most the
           probes in flight. Rows are bit-identical whatever the number of workers (same thread
           count). N workers hold N models: N × the memory of one.
``ray``    one Ray task per checkpoint (``num_cpus=1``, ``num_gpus=1`` when the cluster has GPUs);
           the token sets and plan go to the object store once; each worker process keeps one
           :class:`CheckpointLoader` (one model instance) across its tasks; rows come back to the
           driver, which writes them as each task completes (``ray.wait``). A kill loses at most the
           checkpoints in flight. A worker crash is recorded as failed rows of that checkpoint.
           ``ray.init(address=...)`` joins a cluster; without an address a local one is started
           (``num_workers`` CPUs, default all cores, no dashboard) and shut down at the end.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from losslens.lm.core.worker_loop import WorkerError
from losslens.measure.probes.rows import ProbeRow
from losslens.measure.probes.validation import PlanError

from losslens.study.sweep.data_parallel import data_parallel_group, sweep_data
from losslens.study.sweep.executors import auto_device, execute_local, execute_ray, follow_rank0
from losslens.study.sweep.local_workers import check_memory, resolve_workers
from losslens.study.sweep.lock import StoreLock
from losslens.study.sweep.options import EXECUTORS, SweepOptions
from losslens.study.sweep.outcome import SweepError, SweepReport
from losslens.study.sweep.plan import Plan, load_plan
from losslens.study.sweep.progress import SweepProgress
from losslens.study.sweep.store import Store


# --------------------------------------------------------------------------- inputs
def resolve_trajectory(trajectory, cache_dir=None, schedule=None, tokens_per_step=None, sidecars=()):
    """A :class:`losslens.lm.checkpoints.Trajectory` from a Trajectory, a folder path or a hub name
    ``hf:ORG/NAME@REVISIONS``, with a schedule attached (:func:`losslens.lm.checkpoints.open_trajectory`)."""
    from losslens.lm.checkpoints import Trajectory, open_trajectory

    if not isinstance(trajectory, (Trajectory, str, Path)):
        raise SweepError(
            "a trajectory must be a losslens.lm.checkpoints.Trajectory, a folder path or a hub name "
            f"hf:ORG/NAME@REVISIONS, got {type(trajectory).__name__}"
        )
    return open_trajectory(
        trajectory, cache_dir=cache_dir, schedule=schedule, tokens_per_step=tokens_per_step, sidecars=sidecars
    )


def with_plan_checkpoints(traj, plan: Plan):
    """The trajectory with the plan's LAWA checkpoints appended, and the refs the plan selects."""
    for k in plan.lawa:
        real = [r for r in traj if getattr(r, "kind", None) != "derived"]
        if len(real) < k:
            raise PlanError(f"lawa k={k} needs at least {k} checkpoints; the trajectory has {len(real)}")
        traj = traj.with_lawa(k=k)
    refs = list(traj)
    if plan.checkpoints is not None:
        labels = [str(r.label) for r in refs]
        unknown = [c for c in plan.checkpoints if c not in labels]
        if unknown:
            raise PlanError(
                f"plan.checkpoints names unknown label(s) {unknown}; the trajectory has: {', '.join(labels)}"
            )
        keep = set(plan.checkpoints)
        refs = [r for r in refs if str(r.label) in keep]
    return traj, refs


# --------------------------------------------------------------------------- entry point
def run_sweep(
    trajectory,
    plan: "Plan | str | Path | Mapping | None" = None,
    out: "str | Path | Store" = "results.sqlite",
    options: SweepOptions | None = None,
    **overrides,
) -> SweepReport:
    """Run ``plan`` over ``trajectory`` and write every probe's row to the store ``out``.

    Args:
        trajectory: a :class:`Trajectory`, a trajectory folder or ``hf:ORG/NAME@REVISIONS``
            (:func:`resolve_trajectory`).
        plan: a :class:`Plan`, a .toml/.yaml/.json file, a mapping, or None (:meth:`Plan.default`).
        out: the SQLite file (created if missing) or an open :class:`Store`.
        options: how to run (:class:`~losslens.study.sweep.options.SweepOptions`: executor, workers, threads,
            device, resuming, the writer lock, data-parallel ranks …); default ``SweepOptions()``.
        overrides: any of its fields by name, replacing ``options``' value
            (``run_sweep(t, plan, out, executor="ray", address="auto")``).

    Every checkpoint is evaluated under its own config; checkpoints whose configs differ from the
    first one's are named in ``report.notes``.

    Returns:
        :class:`SweepReport` (``report.exit_code``: 0, 1 when some rows of the plan are stored as
        failed, 3 when all are). Raises :class:`PlanError`, :class:`StoreError` (also
        ``StoreLockedError``), :class:`SweepError` before any work when the inputs are wrong; probe
        failures never raise (failed rows).
    """
    opts = (options or SweepOptions()).with_overrides(**overrides)
    t_start = time.perf_counter()
    if opts.executor not in EXECUTORS:
        raise SweepError(f"unknown executor {opts.executor!r}; valid: {', '.join(EXECUTORS)}")
    group = data_parallel_group(opts.parallel, opts.executor, opts.num_workers, opts.pool, SweepError)
    if group is not None:
        opts = replace(opts, num_workers=1)
    plan = load_plan(plan)
    traj, refs = with_plan_checkpoints(resolve_trajectory(trajectory), plan)
    if not refs:
        raise SweepError("the trajectory has no checkpoint to probe")
    local = opts.executor == "local"
    if local and opts.device is not None:
        from losslens.lm.checkpoints.loader import usable_device

        usable_device(opts.device)  # a bad --device stops here, before data and the store
    workers, note = 1, None
    if local:  # a worker count that cannot work stops here, before data and the store
        dev, pool = auto_device(opts.device), opts.pool
        try:
            workers = (
                pool.size
                if pool is not None
                else resolve_workers(opts.num_workers, len(refs), dev, opts.num_threads)[0]
            )
            workers, note = check_memory(
                workers, refs, opts.dtype, dev, explicit=opts.num_workers is not None or pool is not None
            )
        except WorkerError as exc:
            raise SweepError(str(exc)) from exc
    own_store = not isinstance(out, Store)
    lock = StoreLock(out.path if not own_store else out)  # one writer per store, before any work
    main = group is None or group.rank == 0
    take = lambda: lock.acquire(wait=opts.wait, on_wait=opts.on_wait)  # noqa: E731
    if group is not None:  # rank 0 alone holds the lock and the store; the others follow its plan
        group.agree(lambda: take() if main else None, "taking the store's lock")
    else:
        take()
    store = None
    try:
        if not main:
            return follow_rank0(group, plan, traj, refs, opts, t_start)
        t_data = time.perf_counter()
        sets, dhash, per = sweep_data(group, plan, traj, opts.token_sets, SweepError)
        data_seconds = time.perf_counter() - t_data
        tasks = plan.tasks()
        run = opts.run if opts.run is not None else plan.name
        try:
            store = Store(out) if own_store else out
            store.bind(plan, dhash, per, allow_mixed=opts.allow_mixed, run=run)
            store.add_checkpoints(list(traj), run=run)
            existing = store.existing(run)
            work = []
            for ref in refs:
                todo = store.pending(
                    str(ref.label), tasks, dhash, retry_failed=opts.retry_failed, existing=existing, run=run
                )
                if todo:
                    work.append((ref, todo))
        except Exception as exc:
            if group is not None:  # the other ranks wait for the work: tell them why there is none
                group.gather_objects(("error", f"{type(exc).__name__}: {exc}"))
            raise
        if group is not None:  # the other ranks run exactly this work, in this order
            group.gather_objects(("work", [(str(ref.label), todo) for ref, todo in work]))
        n_todo = sum(len(t) for _, t in work)
        report = SweepReport(
            store.path,
            plan.hash,
            dhash,
            opts.executor,
            len(refs),
            len(refs) * len(tasks),
            n_skipped=len(refs) * len(tasks) - n_todo,
            data_seconds=data_seconds,
            kept_failures=_kept_failures(store, run, refs, work),
            notes=_config_notes(refs) + ([note] if note else []),
        )

        def write(row: ProbeRow) -> None:
            store.write(row, data_hash=dhash, plan_hash=plan.hash, run=run)
            _count(report, row)
            bar.measured(row)
            if opts.on_row is not None:
                opts.on_row(row)

        threads = opts.num_threads
        if local:
            if opts.pool is None:
                workers, threads = resolve_workers(workers, len(work), auto_device(opts.device), opts.num_threads)
            report.workers = opts.pool.size if opts.pool is not None else workers
        pending = [[t.key for t in todo] for _, todo in work]
        at_once = report.workers if local else int(opts.num_workers or os.cpu_count() or 1)
        bar = SweepProgress(n_todo, len(work), enabled=opts.progress, workers=at_once, pending=pending)
        try:
            if local:
                execute_local(work, plan, sets, traj, write, bar, replace(opts, num_threads=threads), workers, group)
            else:
                execute_ray(work, plan, sets, traj, write, bar, opts)
        finally:
            bar.close()
        report.seconds = time.perf_counter() - t_start
        return report
    finally:
        if own_store and store is not None:
            store.close()
        if main:
            lock.release()


def _count(report: SweepReport, row: ProbeRow) -> None:
    """Count a written row into ``report`` (its status, failure and seconds)."""
    report.n_run += 1
    if row.status == "ok":
        report.n_ok += 1
    else:
        report.n_failed += 1
        report.failures.append((row.checkpoint, row.probe, row.spec, row.error or ""))
    key = f"{row.probe}:{row.spec}" if row.spec else row.probe
    ps = report.probe_seconds.setdefault(row.checkpoint, {})
    ps[key] = float(row.seconds or 0.0)
    load = float(row.extra.get("load_seconds", 0.0)) if row.extra else 0.0
    if load:
        ps["load"] = load
    report.checkpoint_seconds[row.checkpoint] = sum(ps.values())


def _kept_failures(store: Store, run: str, refs, work) -> list[tuple[str, str, str, str]]:
    """Failed rows of the plan's checkpoints that this call skips (stored by an earlier call)."""
    todo = {(str(ref.label), t.probe, t.spec) for ref, tasks in work for t in tasks}
    labels = {str(r.label) for r in refs}
    return [
        (c, p, s, e or "") for (c, p, s), e in store.failed_rows(run).items() if c in labels and (c, p, s) not in todo
    ]


def _config_notes(refs) -> list[str]:
    """One note per checkpoint whose config differs (in what changes the function) from the first one's."""
    from losslens.lm.checkpoints.configs import differing_configs

    diffs = differing_configs([r for r in refs if getattr(r, "kind", None) not in ("derived", "hub")])
    if not diffs:
        return []
    first, per = diffs
    return [
        f"checkpoint {label!r} has a config that differs from {first!r}'s in "
        + ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in list(d.items())[:4])
        + ("..." if len(d) > 4 else "")
        + "; it is evaluated under its own config"
        for label, d in per.items()
    ]


__all__ = ["run_sweep", "resolve_trajectory", "with_plan_checkpoints"]

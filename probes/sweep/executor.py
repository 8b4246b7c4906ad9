"""Running a plan over a trajectory: in-process or on Ray, every finished probe committed at once.

:func:`run_sweep` is the one entry point (the CLI's ``losslens sweep`` calls it)::

    from probes.sweep import Plan, run_sweep
    report = run_sweep("runs/wsd", Plan.default(), out="wsd.sqlite")            # in-process
    report = run_sweep("runs/wsd", "plan.toml", out="wsd.sqlite", executor="ray",
                       address="auto")                                         # an existing cluster

Steps: resolve the trajectory (a folder → :meth:`Trajectory.from_folder`) and append the plan's LAWA
checkpoints; build the token sets once (:func:`probes.data.default_token_sets` with the plan's
shapes and seed, or the plan's saved files, or ``token_sets=``) and hash them; bind the store
(refusing another plan's store unless ``allow_mixed``); skip every row already ``ok`` with the same
settings (and ``failed`` rows unless ``retry_failed``); run the rest.

Executors
---------
``local``  checkpoints in trajectory order, on ``num_workers`` worker processes (default: one per
           core, each with one torch thread; 1 on CUDA or for a single checkpoint; see
           :mod:`probes.sweep.parallel`) or, with one worker, in this process. Each probe's row is written by
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

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from geometry.base.errors import LosslensError
from probes.core.threads import torch_threads
from probes.core.workers import WorkerError

from .lock import StoreLock
from .datasets import build_data, data_hashes
from .parallel import check_memory, execute_workers, resolve_workers
from .plan import Plan, PlanError, Task, load_plan
from .ranks import data_parallel_group, sweep_data
from .rows import error_type
from .runner import get_loader, probe_checkpoint
from .store import ProbeRow, Store

EXECUTORS = ("local", "ray")
EXIT_SOME_FAILED = 1
"""Exit status of ``losslens sweep`` when some rows of the plan are stored as failed."""
EXIT_ALL_FAILED = 3
"""Exit status of ``losslens sweep`` when every row of the plan is stored as failed."""


class SweepError(LosslensError, RuntimeError):
    """The sweep cannot start (bad trajectory, unknown checkpoint label, Ray missing, ...)."""


@dataclass
class SweepReport:
    """What a :func:`run_sweep` call did.

    ``n_tasks``: row keys of the plan over all checkpoints; ``n_skipped``: already in the store;
    ``n_run`` = ``n_ok + n_failed`` rows written by this call; ``seconds``: wall time of the call
    (data building included); ``checkpoint_seconds``: per checkpoint, load + probes (local) or the
    task's probe time (ray); ``probe_seconds``: ``{checkpoint: {probe[:spec]: seconds}}``.
    ``workers``: local worker processes (1: in this process; Ray: the tasks' CPUs are Ray's).
    ``failures``: ``(checkpoint, probe, spec, error)`` of the rows this call stored as failed;
    ``kept_failures``: failed rows of earlier calls that were skipped (``retry_failed=False``);
    ``notes``: things the user should know (checkpoints evaluated under configs that differ).
    """

    store: Path
    plan_hash: str
    data_hash: str
    executor: str
    n_checkpoints: int
    n_tasks: int
    n_run: int = 0
    n_ok: int = 0
    n_failed: int = 0
    n_skipped: int = 0
    seconds: float = 0.0
    data_seconds: float = 0.0
    checkpoint_seconds: dict[str, float] = field(default_factory=dict)
    probe_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[tuple[str, str, str, str]] = field(default_factory=list)
    kept_failures: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workers: int = 1

    def __str__(self) -> str:
        how = f"{self.executor}, {self.workers} workers" if self.workers > 1 else self.executor
        s = (f"{self.n_checkpoints} checkpoints, {self.n_tasks} rows: {self.n_ok} ok, {self.n_failed} failed, "
             f"{self.n_skipped} already done; {self.seconds:.1f} s ({how}) -> {self.store}")
        if self.kept_failures:
            s += (f"; {len(self.kept_failures)} of the rows already done are stored as failed "
                  "(--retry-failed / retry_failed=True reruns them)")
        return s

    @property
    def n_failed_total(self) -> int:
        """Rows of the plan stored as failed after this call (this call's and the kept ones)."""
        return self.n_failed + len(self.kept_failures)

    @property
    def exit_code(self) -> int:
        """0 when no row of the plan is stored as failed, :data:`EXIT_ALL_FAILED` (3) when every row
        is, :data:`EXIT_SOME_FAILED` (1) otherwise."""
        if self.n_failed_total == 0:
            return 0
        return EXIT_ALL_FAILED if self.n_failed_total >= self.n_tasks else EXIT_SOME_FAILED

    def failure_summary(self) -> dict[str, dict]:
        """Failed rows by error type: ``{type: {"rows": n, "checkpoints": [...], "example": message}}``,
        most frequent first (this call's failures and the kept ones)."""
        out: dict[str, dict] = {}
        for ck, _probe, _spec, err in [*self.failures, *self.kept_failures]:
            e = out.setdefault(error_type(err), {"rows": 0, "checkpoints": [], "example": err})
            e["rows"] += 1
            if ck not in e["checkpoints"]:
                e["checkpoints"].append(ck)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["rows"]))


# --------------------------------------------------------------------------- inputs
def resolve_trajectory(trajectory, cache_dir=None, schedule=None, tokens_per_step=None, sidecars=()):
    """A :class:`probes.checkpoints.Trajectory` from a Trajectory, a folder path or a hub name
    ``hf:ORG/NAME@REVISIONS``, with a schedule attached (:func:`probes.checkpoints.open_trajectory`)."""
    from probes.checkpoints import Trajectory, open_trajectory

    if not isinstance(trajectory, (Trajectory, str, Path)):
        raise SweepError("a trajectory must be a probes.checkpoints.Trajectory, a folder path or a hub name "
                         f"hf:ORG/NAME@REVISIONS, got {type(trajectory).__name__}")
    return open_trajectory(trajectory, cache_dir=cache_dir, schedule=schedule, tokens_per_step=tokens_per_step,
                           sidecars=sidecars)


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
            raise PlanError(f"plan.checkpoints names unknown label(s) {unknown}; the trajectory has: {', '.join(labels)}")
        keep = set(plan.checkpoints)
        refs = [r for r in refs if str(r.label) in keep]
    return traj, refs


class SweepProgress:
    """Rich progress display: one bar over probes (ETA) and one over checkpoints; no-op when quiet."""

    def __init__(self, n_probes: int, n_checkpoints: int, enabled: bool = True):
        self.enabled = enabled and n_probes > 0
        self._p = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self._p = Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self._ck = self._p.add_task("checkpoints", total=n_checkpoints)
        self._pr = self._p.add_task("probes", total=n_probes)
        self._p.start()

    def start_probe(self, label: str, task: Task) -> None:
        if self._p is not None:
            spec = f" {task.spec}" if task.spec else ""
            self._p.update(self._pr, description=f"{label} · {task.probe}{spec}")

    def probe_done(self, n: int = 1) -> None:
        if self._p is not None:
            self._p.advance(self._pr, n)

    def checkpoint_done(self, label: str) -> None:
        if self._p is not None:
            self._p.update(self._ck, advance=1, description=f"checkpoints (last: {label})")

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


# --------------------------------------------------------------------------- data-parallel sweeps
def _follow_rank0(group, plan, token_sets, traj, refs, device, dtype, num_threads, allow_pickle, progress, executor,
                  t_start) -> "SweepReport":
    """A rank other than 0 in a data-parallel sweep: build the same data, take rank 0's list of what
    is left to do, probe it in the same order (its rows are rank 0's to write) and report the count."""
    sets, dhash, _ = sweep_data(group, plan, traj, token_sets, SweepError)
    kind, payload = group.gather_objects(None)[0]
    if kind == "error":
        raise SweepError(f"rank 0 could not prepare the sweep: {payload}")
    by_label = {str(ref.label): ref for ref in refs}
    work = [(by_label[label], todo) for label, todo in payload]
    n_todo = sum(len(t) for _, t in work)
    report = SweepReport(None, plan.hash, dhash, executor, len(refs), len(refs) * len(plan.tasks()),
                         n_skipped=len(refs) * len(plan.tasks()) - n_todo)

    def count(row: ProbeRow) -> None:
        report.n_run += 1
        report.n_ok += row.status == "ok"
        report.n_failed += row.status != "ok"

    _execute_local(work, plan, sets, traj, count, SweepProgress(n_todo, len(work), enabled=False),
                   _auto_device(device), dtype, num_threads, allow_pickle, 1, None, group)
    report.seconds = time.perf_counter() - t_start
    return report


# --------------------------------------------------------------------------- executors
def _execute_local(work, plan, token_sets, traj, write, progress: SweepProgress, device, dtype, num_threads=None,
                   allow_pickle: bool = False, workers: int = 1, pool=None, group=None):
    if workers > 1 or pool is not None:
        execute_workers(work, plan, token_sets, traj, write, progress, device, dtype, workers, num_threads, allow_pickle, pool)
        return
    loader = get_loader(traj, device=device, dtype=dtype, allow_pickle=allow_pickle)
    with torch_threads(num_threads):
        for ref, tasks in work:
            for row in probe_checkpoint(ref, tasks, plan, token_sets, loader, on_start=progress.start_probe, parallel=group):
                write(row)
                progress.probe_done()
            progress.checkpoint_done(str(ref.label))


def _auto_device(device):
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else None


def _remote_checkpoint(payload, ref, tasks):
    """Body of a Ray task: every pending task of one checkpoint, rows returned as a list."""
    plan, token_sets, traj, device, dtype, num_threads, allow_pickle = payload
    loader = get_loader(traj, device=_auto_device(device), dtype=dtype, allow_pickle=allow_pickle)
    with torch_threads(num_threads):
        return list(probe_checkpoint(ref, tasks, plan, token_sets, loader))


def _execute_ray(work, plan, token_sets, traj, write, progress: SweepProgress, device, dtype, address, num_workers, num_gpus,
                 num_threads=None, allow_pickle: bool = False):
    try:
        import ray
    except ImportError as exc:
        raise SweepError("the ray executor needs Ray: pip install 'ray[default]' (or losslens[ray])") from exc
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(logging_level=logging.WARNING, log_to_driver=False)
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=int(num_workers or os.cpu_count() or 1), include_dashboard=False, **kw)
        started = True
    try:
        if num_gpus is None:
            num_gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        remote = ray.remote(num_cpus=1, num_gpus=num_gpus, max_retries=0)(_remote_checkpoint)
        payload = ray.put((plan, dict(token_sets), traj, device, dtype, num_threads, allow_pickle))
        futures = {remote.remote(payload, ref, tasks): (ref, tasks) for ref, tasks in work}
        pending = list(futures)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for fut in ready:
                ref, tasks = futures[fut]
                try:
                    rows = ray.get(fut)
                except Exception as exc:  # worker died, object lost, ...
                    msg = f"ray task for checkpoint {ref.label!r} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                    rows = [ProbeRow.failed(str(ref.label), t, msg) for t in tasks]
                for row in rows:
                    write(row)
                progress.probe_done(len(rows))
                progress.checkpoint_done(str(ref.label))
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------- entry point
def run_sweep(trajectory, plan: "Plan | str | Path | Mapping | None" = None, out: "str | Path | Store" = "results.sqlite",
              executor: str = "local", address: str | None = None, retry_failed: bool = False, allow_mixed: bool = False,
              token_sets: Mapping[str, Any] | None = None, progress: bool = True, device=None, dtype=None,
              num_workers: int | None = None, num_gpus: float | None = None, num_threads: int | None = None,
              on_row: Callable[[ProbeRow], None] | None = None, run: str | None = None, wait: bool = False,
              on_wait: Callable[[dict], None] | None = None, allow_pickle: bool = False, pool=None,
              parallel: str = "none") -> SweepReport:
    """Run ``plan`` over ``trajectory`` and write every probe's row to the store ``out``.

    Args:
        trajectory: a :class:`Trajectory`, a trajectory folder or ``hf:ORG/NAME@REVISIONS`` (:func:`resolve_trajectory`).
        plan: a :class:`Plan`, a .toml/.yaml/.json file, a mapping, or None (:meth:`Plan.default`).
        out: the SQLite file (created if missing) or an open :class:`Store`.
        executor: 'local' or 'ray'. ``address``: Ray cluster address ('auto', 'ray://…');
            None starts a local cluster with ``num_workers`` CPUs. ``num_gpus`` per Ray task: default
            1 when the cluster has GPUs, else 0.
        num_workers: local: worker processes, each probing whole checkpoints with its own model
            (N workers need N × the memory of one; refused up front when N models clearly exceed
            the available memory). Default ``$LOSSLENS_WORKERS``, else the cores (÷ ``num_threads``),
            but 1 on CUDA; never more than the checkpoints to probe; 1 runs in this process. Ray:
            CPUs of the local cluster it starts.
        pool: a :class:`probes.core.workers.WorkerPool` to run the local sweep on (left open, so
            several sweeps share its workers; ``num_workers`` is then its size).
        retry_failed: rerun rows stored as failed (otherwise they are kept and skipped).
        allow_mixed: accept a store written by another plan/data (rows keep their plan hash; rows
            computed with other settings are recomputed).
        token_sets: ``{"eval", "calibration", "curvature": TokenSet}`` to use instead of building them.
        progress: show the rich progress display (False: quiet).
        num_threads: torch intra-op threads while probing (local: this process, restored after, or
            each worker; ray: each task). None: the cores shared out between local workers (1 each
            when there is one worker per core), torch's default with one local process (Ray workers
            get 1 per CPU requested).
            Small models run fastest with 1 thread; a machine shared with other jobs can slow
            multi-threaded torch down by an order of magnitude (oversubscription).
        device, dtype: where/how checkpoints are loaded (default: the loader's; CUDA when present).
        on_row: called with each row after it is committed.
        run: name of this trajectory's run in the store (default: the plan's name). One store can
            hold several runs (e.g. a WSD and a cosine trajectory) as long as they share plan and data.
        wait: when another sweep holds the store's writer lock (:mod:`probes.sweep.lock`), wait for
            it (``on_wait(holder)`` is called once first) instead of raising
            :class:`~probes.sweep.lock.StoreLockedError`.
        allow_pickle: load ``.bin``/``.pt`` checkpoints that need full pickle (only for trusted files).
        parallel: ``"data"`` inside an initialised ``torch.distributed`` group (``torchrun … sweep
            --parallel data``): every rank probes every checkpoint with one process (local executor),
            the curvature batches split over the ranks (:mod:`geometry.operators.parallel`); rank 0
            alone takes the store's lock, decides what is left to do (resumable as always), writes
            the rows and reports; the other ranks return a report of the rows they computed.

    Every checkpoint is evaluated under its own config; checkpoints whose configs differ from the
    first one's are named in ``report.notes``.

    Returns:
        :class:`SweepReport` (``report.exit_code``: 0, 1 when some rows of the plan are stored as
        failed, 3 when all are). Raises :class:`PlanError`, :class:`StoreError` (also
        ``StoreLockedError``), :class:`SweepError` before any work when the inputs are wrong; probe
        failures never raise (failed rows).
    """
    t_start = time.perf_counter()
    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    group = data_parallel_group(parallel, executor, num_workers, pool, SweepError)
    if group is not None:
        num_workers = 1
    plan = load_plan(plan)
    traj, refs = with_plan_checkpoints(resolve_trajectory(trajectory), plan)
    if not refs:
        raise SweepError("the trajectory has no checkpoint to probe")
    if executor == "local" and device is not None:
        from probes.checkpoints.loader import usable_device

        usable_device(device)  # a bad --device stops here, before data and the store
    workers, note = 1, None
    if executor == "local":  # a worker count that cannot work stops here, before data and the store
        dev = _auto_device(device)
        try:
            workers = pool.size if pool is not None else resolve_workers(num_workers, len(refs), dev, num_threads)[0]
            workers, note = check_memory(workers, refs, dtype, dev, explicit=num_workers is not None or pool is not None)
        except WorkerError as exc:
            raise SweepError(str(exc)) from exc
    own_store = not isinstance(out, Store)
    lock = StoreLock(out.path if not own_store else out)  # one writer per store, before any work
    main = group is None or group.rank == 0
    if group is not None:  # rank 0 alone holds the lock and the store; the others follow its plan
        group.agree(lambda: lock.acquire(wait=wait, on_wait=on_wait) if main else None, "taking the store's lock")
    else:
        lock.acquire(wait=wait, on_wait=on_wait)
    store = None
    try:
        if not main:
            return _follow_rank0(group, plan, token_sets, traj, refs, device, dtype, num_threads, allow_pickle, progress,
                                 executor, t_start)
        t_data = time.perf_counter()
        sets, dhash, per = sweep_data(group, plan, traj, token_sets, SweepError)
        data_seconds = time.perf_counter() - t_data
        tasks = plan.tasks()
        try:
            store = Store(out) if own_store else out
            run = run if run is not None else plan.name
            store.bind(plan, dhash, per, allow_mixed=allow_mixed, run=run)
            store.add_checkpoints(list(traj), run=run)
            existing = store.existing(run)
            work = []
            for ref in refs:
                todo = store.pending(str(ref.label), tasks, dhash, retry_failed=retry_failed, existing=existing, run=run)
                if todo:
                    work.append((ref, todo))
        except Exception as exc:
            if group is not None:  # the other ranks wait for the work: tell them why there is none
                group.gather_objects(("error", f"{type(exc).__name__}: {exc}"))
            raise
        if group is not None:  # the other ranks run exactly this work, in this order
            group.gather_objects(("work", [(str(ref.label), todo) for ref, todo in work]))
        n_todo = sum(len(t) for _, t in work)
        report = SweepReport(store.path, plan.hash, dhash, executor, len(refs), len(refs) * len(tasks),
                             n_skipped=len(refs) * len(tasks) - n_todo, data_seconds=data_seconds,
                             kept_failures=_kept_failures(store, run, refs, work), notes=_config_notes(refs) + ([note] if note else []))

        def write(row: ProbeRow) -> None:
            store.write(row, data_hash=dhash, plan_hash=plan.hash, run=run)
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
            if on_row is not None:
                on_row(row)

        bar = SweepProgress(n_todo, len(work), enabled=progress)
        try:
            if executor == "local":
                threads = num_threads
                if pool is None:
                    workers, threads = resolve_workers(workers, len(work), _auto_device(device), num_threads)
                report.workers = pool.size if pool is not None else workers
                _execute_local(work, plan, sets, traj, write, bar, _auto_device(device), dtype, threads, allow_pickle,
                               workers, pool, group)
            else:
                _execute_ray(work, plan, sets, traj, write, bar, device, dtype, address, num_workers, num_gpus, num_threads,
                             allow_pickle)
        finally:
            bar.close()
        report.seconds = time.perf_counter() - t_start
        return report
    finally:
        if own_store and store is not None:
            store.close()
        if main:
            lock.release()


def _kept_failures(store: Store, run: str, refs, work) -> list[tuple[str, str, str, str]]:
    """Failed rows of the plan's checkpoints that this call skips (stored by an earlier call)."""
    todo = {(str(ref.label), t.probe, t.spec) for ref, tasks in work for t in tasks}
    labels = {str(r.label) for r in refs}
    return [(c, p, s, e or "") for (c, p, s), e in store.failed_rows(run).items() if c in labels and (c, p, s) not in todo]


def _config_notes(refs) -> list[str]:
    """One note per checkpoint whose config differs (in what changes the function) from the first one's."""
    from probes.checkpoints.configs import differing_configs

    diffs = differing_configs([r for r in refs if getattr(r, "kind", None) not in ("derived", "hub")])
    if not diffs:
        return []
    first, per = diffs
    return [f"checkpoint {label!r} has a config that differs from {first!r}'s in "
            + ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in list(d.items())[:4]) + ("..." if len(d) > 4 else "")
            + "; it is evaluated under its own config" for label, d in per.items()]


__all__ = ["run_sweep", "SweepReport", "SweepError", "SweepProgress", "resolve_trajectory", "build_data", "data_hashes",
           "with_plan_checkpoints", "EXECUTORS", "EXIT_SOME_FAILED", "EXIT_ALL_FAILED"]

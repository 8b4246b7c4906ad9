"""The executors of a sweep: in this process or on local worker processes (:func:`execute_local`), on
Ray (:func:`execute_ray`), and a data-parallel rank other than 0 (:func:`follow_rank0`).

Each takes ``work`` (``[(ref, pending tasks), ...]`` in trajectory order), the plan, the token sets,
the trajectory, ``write(row)`` (called in this process for every row as it arrives), a
:class:`~losslens.study.sweep.progress.SweepProgress` and the call's
:class:`~losslens.study.sweep.options.SweepOptions`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

from losslens.lm.core.threads import torch_threads
from losslens.measure.probes.rows import ProbeRow

from losslens.study.sweep.data_parallel import sweep_data
from losslens.study.sweep.local_workers import execute_workers
from losslens.study.sweep.options import SweepOptions
from losslens.study.sweep.outcome import SweepError, SweepReport
from losslens.study.sweep.progress import SweepProgress
from losslens.study.sweep.runner import get_loader, probe_checkpoint


def auto_device(device):
    """``device``, else CUDA when torch sees one, else None (the loader's default)."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else None


def execute_local(
    work, plan, token_sets, traj, write, progress: SweepProgress, opts: SweepOptions, workers: int = 1, group=None
) -> None:
    """``workers`` > 1 or ``opts.pool``: on worker processes (:mod:`.local_workers`); else in this
    process with ``opts.num_threads`` torch threads. ``group``: this rank's data-parallel group."""
    device = auto_device(opts.device)
    if workers > 1 or opts.pool is not None:
        execute_workers(work, plan, token_sets, traj, write, progress, opts, workers, device)
        return
    loader = get_loader(traj, device=device, dtype=opts.dtype, allow_pickle=opts.allow_pickle)
    with torch_threads(opts.num_threads):
        for ref, tasks in work:
            rows = probe_checkpoint(
                ref, tasks, plan, token_sets, loader, progress.start_probe, group, on_products=progress.products
            )
            for row in rows:
                write(row)
                progress.probe_done()
            progress.checkpoint_done(str(ref.label))


def _remote_checkpoint(payload, ref, tasks):
    """Body of a Ray task: every pending task of one checkpoint, rows returned as a list."""
    plan, token_sets, traj, device, dtype, num_threads, allow_pickle = payload
    loader = get_loader(traj, device=auto_device(device), dtype=dtype, allow_pickle=allow_pickle)
    with torch_threads(num_threads):
        return list(probe_checkpoint(ref, tasks, plan, token_sets, loader))


def execute_ray(work, plan, token_sets, traj, write, progress: SweepProgress, opts: SweepOptions) -> None:
    """One Ray task per checkpoint on the cluster at ``opts.address`` (or a local one of
    ``opts.num_workers`` CPUs, started and shut down here); rows written as each task completes."""
    try:
        import ray
    except ImportError as exc:
        raise SweepError("the ray executor needs Ray: pip install 'ray[default]' (or losslens[ray])") from exc
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(logging_level=logging.WARNING, log_to_driver=False)
        if opts.address:
            ray.init(address=opts.address, **kw)
        else:
            ray.init(num_cpus=int(opts.num_workers or os.cpu_count() or 1), include_dashboard=False, **kw)
        started = True
    try:
        num_gpus = opts.num_gpus
        if num_gpus is None:
            num_gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        remote = ray.remote(num_cpus=1, num_gpus=num_gpus, max_retries=0)(_remote_checkpoint)
        payload = ray.put((plan, dict(token_sets), traj, opts.device, opts.dtype, opts.num_threads, opts.allow_pickle))
        futures = {remote.remote(payload, ref, tasks): (ref, tasks) for ref, tasks in work}
        pending = list(futures)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for fut in ready:
                ref, tasks = futures[fut]
                try:
                    rows = ray.get(fut)
                except Exception as exc:  # worker died, object lost, ...
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    msg = f"ray task for checkpoint {ref.label!r} failed: {type(exc).__name__}: {first}"
                    rows = [ProbeRow.failed(str(ref.label), t, msg) for t in tasks]
                for row in rows:
                    write(row)
                progress.probe_done(len(rows))
                progress.checkpoint_done(str(ref.label))
    finally:
        if started:
            ray.shutdown()


def follow_rank0(group, plan, traj, refs, opts: SweepOptions, t_start: float) -> SweepReport:
    """A rank other than 0 in a data-parallel sweep: build the same data, take rank 0's list of what
    is left to do, probe it in the same order (its rows are rank 0's to write) and report the count."""
    sets, dhash, _ = sweep_data(group, plan, traj, opts.token_sets, SweepError)
    kind, payload = group.gather_objects(None)[0]
    if kind == "error":
        raise SweepError(f"rank 0 could not prepare the sweep: {payload}")
    by_label = {str(ref.label): ref for ref in refs}
    work = [(by_label[label], todo) for label, todo in payload]
    n_todo = sum(len(t) for _, t in work)
    report = SweepReport(
        None,
        plan.hash,
        dhash,
        opts.executor,
        len(refs),
        len(refs) * len(plan.tasks()),
        n_skipped=len(refs) * len(plan.tasks()) - n_todo,
    )

    def count(row: ProbeRow) -> None:
        report.n_run += 1
        report.n_ok += row.status == "ok"
        report.n_failed += row.status != "ok"

    execute_local(
        work,
        plan,
        sets,
        traj,
        count,
        SweepProgress(n_todo, len(work), enabled=False),
        replace(opts, pool=None),
        1,
        group,
    )
    report.seconds = time.perf_counter() - t_start
    return report


__all__ = ["execute_local", "execute_ray", "follow_rank0", "auto_device"]

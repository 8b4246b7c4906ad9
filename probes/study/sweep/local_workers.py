"""The local executor on several cores: checkpoints probed in N worker processes, rows written by the parent.

:func:`execute_workers` hands each pending checkpoint of a sweep to one worker of a
:class:`losslens.lm.core.workers.WorkerPool` (fresh interpreters, ``threads`` torch threads each). A
worker loads the checkpoint into its own model (one :class:`CheckpointLoader` per process, reused
across its checkpoints), runs :func:`losslens.study.sweep.runner.probe_checkpoint` and sends every row to
the parent the moment its probe finishes; only the parent writes to the store (it holds the
store's writer lock), each row in its own transaction, as the in-process executor does. So:

- the rows equal a one-process run's bit for bit when both use the same thread count (the same
  seeds, data and weights; every row is computed from its checkpoint alone);
- a kill of the whole sweep loses at most the probes in flight (one per worker); a worker that dies
  (killed, out of memory) turns the rest of its checkpoint into failed rows naming the cause, a new
  worker takes its place, and ``--retry-failed`` reruns them;
- Ctrl-C stops the workers, writes the rows they had already sent, and raises KeyboardInterrupt.

Memory: every worker holds its own model and curvature graphs, so N workers need about N times
the memory of one; :func:`check_memory` refuses (explicit N) or lowers (default N) a worker count
whose models alone exceed the available memory.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

from losslens.lm.core.worker_loop import WorkerError, emit
from losslens.lm.core.workers import WorkerPool, available_cores

from losslens.measure.probes.rows import ProbeRow

from losslens.study.sweep.options import SweepOptions

ENV_WORKERS = "LOSSLENS_WORKERS"
"""Environment variable with the default number of local worker processes; when unset, the cores."""

__all__ = ["resolve_workers", "check_memory", "execute_workers", "checkpoint_job", "ENV_WORKERS"]


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def resolve_workers(
    num_workers: int | None, n_checkpoints: int, device=None, num_threads: int | None = None
) -> tuple[int, int | None]:
    """``(workers, torch threads per worker)`` for a local sweep of ``n_checkpoints`` checkpoints.

    ``num_workers`` None: ``$LOSSLENS_WORKERS`` when set, else the cores divided by
    ``num_threads`` (default 1 thread each), but 1 on a CUDA device (one GPU) and off POSIX. Never more workers
    than checkpoints. Threads: ``num_threads`` when given; with several workers, the cores shared
    out (N workers × threads ≤ cores); with one worker None (torch's default, as before).
    """
    if num_workers is None:
        env = os.environ.get(ENV_WORKERS, "").strip()
        if env:
            try:
                num_workers = int(env)
            except ValueError:
                raise WorkerError(f"{ENV_WORKERS} must be a positive integer, got {env!r}") from None
            if num_workers < 1:
                raise WorkerError(f"{ENV_WORKERS} must be a positive integer, got {env!r}")
    if num_workers is None:
        one = _is_cuda(device) or os.name != "posix"  # one GPU; worker processes need POSIX
        num_workers = 1 if one else max(1, available_cores() // max(1, num_threads or 1))
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise WorkerError(f"the number of workers must be an integer >= 1, got {num_workers!r}")
    n = max(1, min(num_workers, n_checkpoints))
    threads = num_threads or (max(1, available_cores() // n) if n > 1 else None)
    return n, threads


def check_memory(n: int, refs, dtype=None, device=None, explicit: bool = True) -> tuple[int, str | None]:
    """``(workers, note)``: ``n`` when N copies of the model fit the available memory
    (:func:`losslens.geometry.memory.budget.available_bytes` of the device, host RAM on CPU); otherwise raise
    :class:`WorkerError` when ``explicit``, or lower n to what fits (note says so). Checked on the
    first checkpoint whose size can be read from its files' headers (hub checkpoints: unchecked)."""
    if n <= 1:
        return n, None
    from losslens.geometry.memory.budget import available_bytes, format_bytes as gb
    from losslens.lm.checkpoints.files import weights_bytes

    size = next((b for b in (weights_bytes(r, dtype) for r in refs[:3]) if b), None)
    if not size:
        return n, None
    free = available_bytes(device or "cpu")
    if n * size <= free:
        return n, None
    fits = max(1, int(free // size))
    msg = (
        f"{n} workers each hold their own copy of the model ({gb(size)}): {gb(n * size)} in all, more than the "
        f"{gb(free)} of memory available"
    )
    if explicit:
        raise WorkerError(f"{msg}; use --workers {fits} (num_workers={fits}) or fewer")
    return fits, f"{msg}; running {fits} worker(s) instead"


def checkpoint_job(context, ref, tasks) -> None:
    """A worker's job: probe one checkpoint; ``("start", task key)`` before each probe,
    ``("products", n)`` for its Hessian-vector products (at most one message a second) and
    ``("row", ProbeRow)`` after it are emitted to the parent."""
    from losslens.study.sweep.runner import get_loader, probe_checkpoint

    plan, token_sets, traj, device, dtype, allow_pickle = context
    loader = get_loader(traj, device=device, dtype=dtype, allow_pickle=allow_pickle)
    products = _Batched(lambda n: emit(("products", n)))
    for row in probe_checkpoint(
        ref, tasks, plan, token_sets, loader, on_start=lambda _label, t: emit(("start", t.key)), on_products=products
    ):
        products.flush()
        emit(("row", row))


class _Batched:
    """Counts handed on at most once every ``seconds`` (a tiny model's thousands of products per second
    would flood the parent's pipe); :meth:`flush` hands on the rest."""

    def __init__(self, send: Callable[[int], None], seconds: float = 1.0):
        self.send, self.seconds, self.n, self.last = send, seconds, 0, time.perf_counter()

    def __call__(self, n: int) -> None:
        self.n += n
        if time.perf_counter() - self.last >= self.seconds:
            self.flush()

    def flush(self) -> None:
        if self.n:
            self.send(self.n)
        self.n, self.last = 0, time.perf_counter()


def execute_workers(
    work,
    plan,
    token_sets,
    traj,
    write: Callable[[ProbeRow], None],
    progress,
    opts: SweepOptions,
    workers: int,
    device=None,
) -> None:
    """Probe ``work`` (``[(ref, pending tasks), ...]``) on ``workers`` processes of
    ``opts.num_threads`` torch threads each (or on ``opts.pool``, left open), loading on ``device``
    with ``opts.dtype``; ``write(row)`` is called in this process for every row as it arrives."""
    pool = opts.pool
    context = (plan, dict(token_sets), traj, device, opts.dtype, opts.allow_pickle)
    jobs = [(checkpoint_job, (ref, tasks)) for ref, tasks in work]
    received = [0] * len(work)
    by_key = [{t.key: t for t in tasks} for _, tasks in work]

    def handle(ev) -> None:
        ref, tasks = work[ev.job]
        label = str(ref.label)
        if ev.kind == "item":
            what, x = ev.value
            if what == "start":
                progress.start_probe(label, by_key[ev.job][x])
            elif what == "products":
                progress.products(x, label)
            else:
                write(x)
                received[ev.job] += 1
                progress.probe_done()
            return
        if ev.kind in ("error", "lost"):
            why = (
                f"worker process failed: {ev.value}"
                if ev.kind == "error"
                else f"{ev.value} while probing checkpoint {label!r}"
            )
            rest = tasks[received[ev.job] :]
            for t in rest:
                write(ProbeRow.failed(label, t, why))
            received[ev.job] += len(rest)
            progress.probe_done(len(rest))
        progress.checkpoint_done(label)

    own = pool is None
    with WorkerPool(workers, opts.num_threads) if own else contextlib.nullcontext(pool) as p:
        try:
            for ev in p.run(jobs, context):
                handle(ev)
        except KeyboardInterrupt:
            for ev in p.interrupt():  # rows the workers had finished and sent: keep them
                handle(ev)
            raise

"""Worker processes: jobs (a function and its arguments) run in N fresh Python processes.

:class:`WorkerPool` starts ``workers`` processes, each a fresh interpreter (never a fork of a
process that already holds torch's thread pools) with ``threads`` torch intra-op threads (OMP and
MKL are told before torch is imported, so N workers × threads cores are used, no more). Jobs are
``(function, args)`` pairs; the function must be importable by name (a module-level function of an
installed module) and is called in a worker as ``function(context, *args)``, where ``context`` is
the object given to :meth:`WorkerPool.run` (sent to each worker once per run, e.g. a plan and its
token sets). A job streams results to the parent with :func:`~losslens.lm.core.worker_loop.emit` while it
runs; its return value comes back when it finishes. Everything travels as plain pickles over one
socket pair per worker (the worker's side and the wire: :mod:`losslens.lm.core.worker_loop`).

Events (:class:`Event`, in the order they arrive; ``job`` is the index into the run's jobs):

- ``item``  a value the job passed to :func:`~losslens.lm.core.worker_loop.emit`;
- ``done``  the job returned (``value``: its return value);
- ``error`` an exception escaped the job (``value``: one line,
  :func:`~losslens.lm.core.worker_loop.short_error`); the worker goes on with the next job;
- ``lost``  the worker process died while running the job (killed, out of memory, a crash in
  native code; ``value``: what happened). A new worker takes its place for the remaining jobs.

Process life: workers ignore SIGINT (Ctrl-C is the parent's to handle: it calls
:meth:`WorkerPool.interrupt`, which stops the workers and returns the events they had already
sent), and on Linux they are killed when the parent dies (``PR_SET_PDEATHSIG``), so a SIGKILLed
sweep leaves no worker computing on. A worker whose parent has gone exits at its next message.

Why not ``multiprocessing.Process`` with the spawn start method: its children re-import the
parent's ``__main__`` script, so a user script that calls a sweep without the
``if __name__ == "__main__":`` guard would start itself again in every worker. These workers run
only losslens' own loop (``python -c``, with the parent's ``sys.path``): scripts and notebooks need
no guard. POSIX only (the socket is passed as an inherited file descriptor).

Memory: every worker holds what its jobs load (a sweep worker: one model and its curvature
graphs), so N workers need about N times the memory of one process.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator

from losslens.geometry.memory.budget import CPU_FRACTION, MEMORY_FRACTION_ENV

from losslens.lm.core.worker_loop import _PROTOCOL, WorkerError, _recv, _send

__all__ = ["WorkerPool", "Event", "available_cores"]

_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from losslens.lm.core.worker_loop import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4]))"
)


@dataclass(frozen=True)
class Event:
    """One message of a job: ``kind`` is 'item', 'done', 'error' or 'lost' (see the module docstring)."""

    job: int
    kind: str
    value: Any = None


def available_cores() -> int:
    """CPU cores this process may use: its affinity mask (``os.cpu_count()`` where there is none),
    capped by a Linux cgroup CPU quota (a container limited to 2 CPUs on a 64-core host gives 2)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    return max(1, min(n, quota) if quota else n)


def _cgroup_cpus(root: str = "/sys/fs/cgroup") -> int | None:
    """CPUs allowed by the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded
    up; None when unlimited or unknown."""
    for path, period_path in (
        (f"{root}/cpu.max", None),
        (f"{root}/cpu/cpu.cfs_quota_us", f"{root}/cpu/cpu.cfs_period_us"),
    ):
        try:
            with open(path) as f:
                parts = f.read().split()
            if period_path is not None:
                with open(period_path) as f:
                    parts = parts[:1] + f.read().split()[:1]
            if len(parts) < 2 or parts[0] in ("max", "-1"):
                return None
            quota, period = int(parts[0]), int(parts[1])
            return max(1, -(-quota // period)) if quota > 0 and period > 0 else None
        except (OSError, ValueError):
            continue
    return None


# --------------------------------------------------------------------------- the parent's side
def _exit_status(code: int | None) -> str:
    if code is None:
        return "is unresponsive"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (killed: out of memory? use fewer workers)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


class _Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(self, threads: int, share: int = 1):
        parent, child = socket.socketpair()
        fd = child.detach()
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        if share > 1 and MEMORY_FRACTION_ENV not in env:
            # N workers share the host's free memory: each default estimator budget gets 1/N of it
            env[MEMORY_FRACTION_ENV] = repr(CPU_FRACTION / share)
        flags = getattr(subprocess, "_args_from_interpreter_flags", lambda: [])()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *flags,
                    "-c",
                    _BOOT,
                    str(fd),
                    str(threads or 0),
                    json.dumps(sys.path),
                    str(os.getpid()),
                ],
                pass_fds=(fd,),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            parent.close()
            raise WorkerError(f"cannot start a worker process ({sys.executable}): {exc}") from exc
        finally:
            os.close(fd)
        self.conn = Connection(parent.detach())
        self.ready = False
        self.job: int | None = None
        self.context: int | None = None  # id of the run whose context the worker holds

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Ask the worker to exit (or kill it), wait for it, close the socket."""
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                try:
                    _send(self.conn, None)
                except OSError:
                    pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


class WorkerPool:
    """``workers`` worker processes with ``threads`` torch threads each; a context manager.

    ``pool.run(jobs, context)`` runs ``jobs`` (``[(function, args), ...]``) and yields
    :class:`Event` s until every job is done, error or lost; runs can follow one another on the
    same workers (their imports and models stay loaded). Leaving the ``with`` block stops the
    workers (killed when the block ends with an exception). Cost: starting a worker takes about
    as long as importing torch and transformers (seconds); workers start in parallel.
    """

    def __init__(self, workers: int, threads: int | None = 1):
        if os.name != "posix":
            raise WorkerError(
                "worker processes need a POSIX system (Linux, macOS); run with one worker "
                "(--workers 1) or use the ray executor"
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise WorkerError(f"workers must be an integer >= 1, got {workers!r}")
        self.threads = int(threads or 0)
        self._runs = itertools.count()
        self._boot_failures = 0
        self._workers = [_Worker(self.threads, workers) for _ in range(workers)]

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [w.proc.pid for w in self._workers]

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(kill=exc_type is not None)

    def close(self, kill: bool = False) -> None:
        """Stop every worker (``kill``: at once, without waiting for its job)."""
        for w in self._workers:
            w.stop(kill=kill)
        self._workers = []

    def run(self, jobs: Iterable[tuple[Callable, tuple]], context: Any = None) -> Iterator[Event]:
        """Run ``jobs`` on the workers, one job per worker at a time, in order of submission;
        yield their events as they arrive (see the module docstring). ``context`` is pickled
        once and sent to each worker before its first job of this run."""
        if not self._workers:
            raise WorkerError("the pool is closed")
        if any(w.job is not None for w in self._workers):
            raise WorkerError("a previous run of this pool was left unfinished; close the pool and start a new one")
        jobs = list(jobs)
        run_id = next(self._runs)
        blob = pickle.dumps(context, protocol=_PROTOCOL)
        todo = deque(range(len(jobs)))
        while todo or any(w.job is not None for w in self._workers):
            for i, w in enumerate(self._workers):
                if w.job is None and todo:
                    j = todo.popleft()
                    if not self._dispatch(w, j, jobs[j], run_id, blob):
                        todo.appendleft(j)  # it never reached the worker: it runs on the replacement
                        self._replace(i)
            busy = {w.conn: w for w in self._workers if w.job is not None}
            if not busy:
                continue
            for conn in wait(list(busy)):
                w = busy[conn]
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    job, i = w.job, self._workers.index(w)
                    if not w.ready:  # died while starting: its job never ran, the replacement takes it
                        self._boot_failed(w)
                        todo.appendleft(job)
                        self._replace(i)
                        continue
                    event = Event(job, "lost", f"worker process {w.proc.pid} {_exit_status(w.proc.wait())}")
                    self._replace(i)
                    yield event
                    continue
                if msg[0] == "ready":
                    w.ready = True
                    continue
                kind, job, value = msg
                if kind != "item":
                    w.job = None
                yield Event(job, kind, value)

    def interrupt(self) -> list[Event]:
        """Stop every worker now (SIGTERM) and return the events they had sent but the parent had
        not read yet (e.g. finished rows after Ctrl-C). The pool is closed afterwards."""
        events = []
        for w in self._workers:
            if w.proc.poll() is None:
                w.proc.terminate()
        for w in self._workers:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            while w.job is not None:
                try:
                    if not w.conn.poll(0):
                        break
                    kind, job, value = _recv(w.conn)
                except (EOFError, OSError, ValueError, pickle.UnpicklingError):
                    break
                if kind == "ready":
                    continue
                events.append(Event(job, kind, value))
                if kind != "item":
                    w.job = None
            w.conn.close()
        self._workers = []
        return events

    # ----------------------------------------------------------------- internals
    def _dispatch(self, w: _Worker, j: int, job: tuple[Callable, tuple], run_id: int, blob: bytes) -> bool:
        fn, args = job
        try:
            if w.context != run_id:
                w.conn.send_bytes(pickle.dumps(("context", run_id, blob), protocol=_PROTOCOL))
                w.context = run_id
            _send(w.conn, ("job", j, pickle.dumps((fn, tuple(args)), protocol=_PROTOCOL), run_id))
        except OSError:
            w.proc.wait()
            while not w.ready and w.conn.poll(0):  # an idle worker's "ready" may still be unread
                try:
                    w.ready = _recv(w.conn)[0] == "ready"
                except (EOFError, OSError):
                    break
            if not w.ready:
                self._boot_failed(w)
            return False
        w.job = j
        return True

    def _boot_failed(self, w: _Worker) -> None:
        """A worker died before it was ready: tolerated once per worker slot (a kill), then an error."""
        self._boot_failures += 1
        if self._boot_failures > len(self._workers):
            raise WorkerError(
                f"worker processes die while starting (the last, PID {w.proc.pid}, "
                f"{_exit_status(w.proc.wait())}); see their messages above"
            )

    def _replace(self, i: int) -> None:
        old = self._workers[i]
        old.stop(kill=True)
        self._workers[i] = _Worker(self.threads)

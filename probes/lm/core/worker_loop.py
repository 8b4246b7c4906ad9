"""The worker's side of :class:`~losslens.lm.core.workers.WorkerPool`, and the wire both sides speak.

A worker process runs ``_serve`` (started by the pool as ``python -c``): it receives a run's
context (pickled, unpickled once at the run's first job) and jobs ``(function, args)``, runs each as
``function(context, *args)`` and sends back its events (``item`` for every :func:`emit`, then ``done``
or ``error`` with :func:`short_error`). Messages are plain pickles, one per ``send_bytes`` on the
worker's socket (``_send``, ``_recv``). Workers ignore SIGINT and, on Linux, die with their
parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from losslens.geometry.base.errors import LosslensError

__all__ = ["WorkerError", "emit", "short_error", "in_worker"]

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_SINK: Callable[[Any], None] | None = None


class WorkerError(LosslensError, RuntimeError):
    """Worker processes cannot be used here (not POSIX) or die before they can take a job."""


def in_worker() -> bool:
    """Whether this code runs inside a :class:`WorkerPool` job."""
    return _SINK is not None


def emit(item: Any) -> None:
    """Send ``item`` to the parent as an ``item`` event of the running job (only inside a job)."""
    if _SINK is None:
        raise WorkerError("emit() is for jobs running in a WorkerPool worker")
    _SINK(item)


def short_error(exc: BaseException) -> str:
    """``"Type: first line of the message (at file.py:line)"``, at most 2000 characters."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}{where}"[:2000]


# --------------------------------------------------------------------------- the wire
def _send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


# --------------------------------------------------------------------------- the worker's side
def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(0)


def _serve(fd: int, threads: int, parent: int) -> None:
    """A worker's loop: receive a context or a job, run it, send its events; exit on None or EOF."""
    global _SINK
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    from losslens.geometry.base.progress import plain_warnings

    plain_warnings()  # as the CLI shows them: one `warning: …` line
    conn = Connection(fd)

    def send(obj: Any) -> None:
        try:
            _send(conn, obj)
        except OSError:  # the parent is gone: nobody wants the result
            os._exit(0)

    import torch

    if threads:
        torch.set_num_threads(threads)
    send(("ready", None, os.getpid()))
    context: list = [None, None, False]  # run id, pickled context, unpickled context (or False: not yet)
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg[0] == "context":
            context[:] = [msg[1], msg[2], False]
            continue
        _, job, payload, run_id = msg
        _SINK = lambda item, job=job: send(("item", job, item))  # noqa: E731
        try:
            if context[0] != run_id:
                raise WorkerError(f"job {job} arrived without its run's context")
            if context[2] is False:
                context[2] = pickle.loads(context[1])  # once per run, at its first job
            fn, args = pickle.loads(payload)
            reply = ("done", job, fn(context[2], *args))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as the job's error
            reply = ("error", job, short_error(exc))
        finally:
            _SINK = None
        send(reply)

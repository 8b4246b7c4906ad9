"""One writer per results store: an advisory lock file beside it (``results.sqlite.lock``).

:func:`losslens.study.sweep.run_sweep` holds :class:`StoreLock` for its whole run. A second sweep on the
same store gets :class:`StoreLockedError` naming the holder (PID, host, start time, command), or
with ``wait=True`` waits until the holder finishes. The lock is ``fcntl.flock`` on the lock file:
the kernel releases it when the holder exits in any way (also SIGKILL), so a killed sweep never
leaves a stale lock. Readers (``losslens report``, ``correlate``) do not take it: SQLite's WAL mode
lets them read while a sweep writes. On systems without ``fcntl`` (Windows) the lock is a no-op;
on a network file system ``flock`` may only exclude writers on the same host (the message names
the holder's host for that reason).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from losslens.study.sweep.store_errors import StoreError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["StoreLock", "StoreLockedError", "lock_path"]


class StoreLockedError(StoreError):
    """Another process is writing to the store (its PID is in the message and in ``holder``)."""

    def __init__(self, message: str, holder: dict | None = None):
        super().__init__(message)
        self.holder = holder or {}


def lock_path(store: str | Path) -> Path:
    """The lock file of a store: ``<store>.lock``."""
    store = Path(store)
    return store.with_name(store.name + ".lock")


class StoreLock:
    """Exclusive writer lock of one store. ``acquire(wait=False)`` / ``release()``, or a context manager.

    ``wait``: block until the holder releases (``on_wait(holder)`` is called once before blocking,
    e.g. to print who is waited for); ``timeout`` seconds (None: no limit) then raises
    :class:`StoreLockedError`. Re-entrant within one :class:`StoreLock` object only.
    """

    def __init__(self, store: str | Path):
        self.store = Path(store)
        self.path = lock_path(self.store)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict:
        """What the current holder wrote into the lock file (pid, host, since, command); {} if unknown."""
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def _message(self, holder: dict) -> str:
        who = f"PID {holder.get('pid', '?')}"
        if holder.get("host") and holder.get("host") != socket.gethostname():
            who += f" on {holder['host']}"
        since = f", since {holder['since']}" if holder.get("since") else ""
        cmd = f" ({holder['command']})" if holder.get("command") else ""
        return (
            f"{self.store} is being written by another sweep: {who}{since}{cmd}. Wait for it to finish "
            f"(or pass --wait / wait=True to queue behind it), or write to another --out file. The lock is "
            f"{self.path}; it is released when that process exits."
        )

    def _try(self) -> bool:
        """One non-blocking attempt; True when this object now holds the lock."""
        self.store.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        # the holder before us may have unlinked the file after we opened it: then retry on the new file
        try:
            same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return self._try()
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300],
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        os.fsync(fd)
        self._fd = fd
        return True

    def acquire(
        self,
        wait: bool = False,
        timeout: float | None = None,
        on_wait: Callable[[dict], None] | None = None,
        poll: float = 0.2,
    ) -> "StoreLock":
        """Take the lock, or raise :class:`StoreLockedError` naming the holder (after ``timeout``
        seconds when waiting)."""
        if fcntl is None or self._fd is not None:
            return self
        if self._try():
            return self
        holder = self.holder()
        if not wait:
            raise StoreLockedError(self._message(holder), holder)
        if on_wait is not None:
            on_wait(holder)
        t0 = time.monotonic()
        while not self._try():
            if timeout is not None and time.monotonic() - t0 > timeout:
                holder = self.holder()
                raise StoreLockedError(f"waited {timeout:g} s: " + self._message(holder), holder)
            time.sleep(poll)
        return self

    def release(self) -> None:
        """Release the lock and remove the lock file."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> "StoreLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

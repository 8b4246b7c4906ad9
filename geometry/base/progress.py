"""Progress of long work on stderr: units done / planned, the rate and the time left (issue #49).

One helper for every long command (``sharpness``' HVPs, ``surface`` / ``landscape`` grid points,
``quantize``'s layers, ``explain``, ``accuracy``, ``sweep``'s rows, ``fork``'s updates)::

    with progress_bar(True, 200, what="trace", unit="HVP") as bar:
        for _ in range(200):
            ...
            bar.update()

- **On a terminal** (stderr is a TTY): a live rich bar (done/planned, rate, elapsed, ETA).
- **In a pipe or a log**: one plain line every ``every`` seconds (default :data:`EVERY`, env
  ``LOSSLENS_PROGRESS_EVERY``): ``[sharpness] trace: 40/200 HVPs (20%), 1.07 s/HVP, elapsed 0:43,
  ETA 2:51``; no carriage returns, no control characters, never cut to the terminal's width.
- **Before the work**: once the first unit is done, one line with the plan and the time it implies,
  measured on that unit: ``[sharpness] planned: 200 HVPs (trace), ~3.1 min (first HVP 0.93 s)``.
- **Never on stdout** (``--json`` output stays clean); ``quiet`` / ``progress=False`` silences it.

The library's convention: a function doing long work takes ``progress`` (True: this display; False:
silent; or a :class:`Progress` / ``callable(n)`` it reports to); a settings object the CLI lists takes
``quiet`` (the commands' ``--quiet``). Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any, Callable, TextIO, Union

EVERY = 10.0
"""Seconds between two plain progress lines in a pipe or a log (``LOSSLENS_PROGRESS_EVERY`` overrides)."""


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get("LOSSLENS_PROGRESS_EVERY", EVERY)))
    except ValueError:
        return EVERY


def duration(seconds: float) -> str:
    """``seconds`` as ``0:43`` / ``1:02:07`` (clock style, rounded to the second)."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def estimate(seconds: float) -> str:
    """A planned duration in words: ``~40 s``, ``~3.1 min``, ``~2.4 h``."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.1f} min"
    return f"~{seconds / 3600:.1f} h"


def _plural(unit: str, n: float) -> str:
    if n == 1 or unit.endswith("s"):
        return unit
    return unit + ("es" if unit.endswith(("ch", "sh", "x")) else "s")


class Progress:
    """Units done out of ``total`` (None: unknown) for the work named ``what``, shown on ``stream``
    (default stderr) under the ``[label]`` prefix. ``live``: a rich bar (default: when the stream is a
    TTY); else plain lines every ``every`` seconds. ``quiet``: nothing at all. ``plan``: print the
    planned line after the first unit. Costs one ``time.perf_counter`` per :meth:`update`."""

    def __init__(
        self,
        total: int | None,
        *,
        what: str,
        unit: str = "step",
        label: str | None = None,
        quiet: bool = False,
        every: float | None = None,
        stream: TextIO | None = None,
        live: bool | None = None,
        plan: bool = True,
    ):
        self.total, self.what, self.unit, self.label = total, what, unit, label
        self.quiet, self.plan = quiet, plan
        self.every = _every() if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.current = ""
        self._said = False  # a line was printed (then close() prints the last one)
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._rich: Any = None
        self._task: Any = None
        if live is None:
            live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.live = live and not quiet
        if self.live:
            self._start_bar()

    # -- display ------------------------------------------------------------------------------
    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
        from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._rich = RichProgress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"{self.unit}s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
            transient=False,
        )
        self._task = self._rich.add_task(self._prefix() + self.what, total=self.total)
        try:
            self._rich.start()
        except Exception:  # noqa: BLE001 - another live display is running (rich allows one): plain lines
            self._rich = self._task = None
            self.live = False

    def _prefix(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def echo(self, text: str) -> None:
        """One line on the progress stream (above a live bar; nothing when quiet)."""
        if self.quiet:
            return
        line = self._prefix() + text
        self._said = True
        if self._rich is not None:
            self._rich.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)

    def describe(self, current: str) -> None:
        """What runs now (a checkpoint and a probe): the bar's text on a terminal, the end of the next
        plain line in a pipe."""
        self.current = current
        if self._rich is not None:
            self._rich.update(self._task, description=f"{self._prefix()}{self.what}: {current}")

    def status(self) -> str:
        """``40/200 HVPs (20%), 1.07 s/HVP, elapsed 0:43, ETA 2:51`` (rate per second when fast)."""
        el = time.perf_counter() - self.t0
        tot = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        out = f"{self.what}: {self.done}{tot} {_plural(self.unit, self.total or self.done)}{pct}"
        if self.done:
            per = el / self.done
            out += f", {per:.3g} s/{self.unit}" if per >= 1 else f", {1 / per:.3g} {_plural(self.unit, 2)}/s"
        out += f", elapsed {duration(el)}"
        if self.done and self.total and self.total > self.done:
            out += f", ETA {duration(el / self.done * (self.total - self.done))}"
        return out + (f" ({self.current})" if self.current else "")

    # -- counting -----------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        """``n`` more units done: the planned line after the first one, a plain line when ``every``
        seconds have passed since the last (pipe), the bar advanced (terminal)."""
        if n <= 0:
            return
        first = self.done == 0
        self.done += n
        if self.quiet:
            return
        now = time.perf_counter()
        if first and self.plan:
            self._planned(now)
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)
        elif now - self._last >= self.every and not (first and self.plan):
            self.echo(self.status())
            self._last = now

    __call__ = update

    def _planned(self, now: float) -> None:
        per = (now - self.t0) / self.done
        if self.total:
            self.echo(
                f"planned: {self.total} {_plural(self.unit, self.total)} for {self.what}, "
                f"{estimate(per * self.total)} (first {self.unit} {per:.3g} s)"
            )
        else:
            self.echo(f"{self.what}: first {self.unit} took {per:.3g} s")
        self._last = now

    def close(self) -> None:
        """Stop the bar; in a pipe, one last line with the units done and the time taken (when a line was
        printed before or the work took `every` seconds or more)."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        elif not self.quiet and self.done and (self._said or time.perf_counter() - self.t0 >= self.every):
            self.echo(
                f"{self.what}: {self.done} {_plural(self.unit, self.done)} in {duration(time.perf_counter() - self.t0)}"
            )
        self.quiet = True  # closed: later updates print nothing

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Callback(Progress):
    """A :class:`Progress` that hands every update to the caller's ``callable(n)`` and prints nothing."""

    def __init__(self, fn: Callable[[int], Any], total: int | None, what: str, unit: str):
        super().__init__(total, what=what, unit=unit, quiet=True)
        self._fn = fn

    def update(self, n: int = 1) -> None:
        self.done += n
        self._fn(n)

    __call__ = update


ProgressArg = Union[bool, None, Progress, Callable[[int], Any]]
"""What a library function's ``progress`` parameter accepts: True (this module's display), False /
None (silent), a :class:`Progress`, or a ``callable(n)`` told of every ``n`` units done."""


def progress_bar(
    progress: ProgressArg, total: int | None, *, what: str, unit: str = "step", label: str | None = None, **kw: Any
) -> Progress:
    """A new :class:`Progress` for ``progress`` (see :data:`ProgressArg`): for a given :class:`Progress`
    (the caller's display), one with its settings (quiet, stream, label, interval) counting this work's
    units; for a ``callable(n)``, one that hands it every update. ``kw``: :class:`Progress`'s other
    settings. Use it as a context manager (closing it ends its bar or prints its last line)."""
    if isinstance(progress, Progress):
        kw = {"stream": progress.stream, "every": progress.every, **kw}
        label = progress.label if label is None else label
        return Progress(total, what=what, unit=unit, label=label, quiet=progress.quiet, **kw)
    if callable(progress) and not isinstance(progress, bool):
        return _Callback(progress, total, what, unit)
    return Progress(total, what=what, unit=unit, label=label, quiet=not progress, **kw)


def echo(progress: ProgressArg, text: str, label: str | None = None) -> None:
    """One stage line (``[label] text``) on stderr when ``progress`` is on (True or a :class:`Progress`);
    nothing for False / None or a plain callable."""
    if isinstance(progress, Progress):
        progress.echo(text)
    elif progress is True:
        print((f"[{label}] " if label else "") + text, file=sys.stderr, flush=True)


_PYTHON_SHOW = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if getattr(category, "__module__", "").startswith("losslens."):
        text = "; ".join(ln.strip() for ln in str(message).splitlines() if ln.strip())
        print(f"warning: {text}", file=file if file is not None else sys.stderr, flush=True)
    else:
        _PYTHON_SHOW(message, category, filename, lineno, file, line)


def plain_warnings() -> None:
    """Show losslens' own warnings (a quantization alarm, ...) as one ``warning: …`` line on stderr,
    without the source file and line Python adds; other libraries' warnings as Python shows them.
    For the CLI and its worker processes (a library user keeps Python's display)."""
    warnings.showwarning = _show_warning


__all__ = ["EVERY", "Progress", "ProgressArg", "duration", "echo", "estimate", "plain_warnings", "progress_bar"]

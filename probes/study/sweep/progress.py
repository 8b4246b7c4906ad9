"""The sweep's progress display: :class:`SweepProgress`, the probes done / planned with an ETA through
the one progress helper (:mod:`losslens.geometry.base.progress`: a live bar on a terminal, plain lines every
few seconds in a pipe or a log, one line per finished checkpoint), on stderr.

The time left is estimated from the rows' own measured seconds (``ProbeRow.seconds``, timed around
the probe in the process that ran it, and the checkpoints' ``load_seconds``), not from the wall time
since the start: on worker processes the first row also carries the workers' start-up and their first
load, which imports the model's code (an up-front plan from it overstated a 19 s sweep as ~1.5 min,
issue #49). Each probe's mean measured seconds times the rows of that probe still to run, plus the
loads to come at the mean load after each worker's first, over the workers the remaining checkpoints
keep busy, gives the estimate; it is refined with every row and said on each finished checkpoint's
line."""

from __future__ import annotations

import re
import time
from collections import Counter

from losslens.geometry.base.progress import Progress, duration, estimate


class _RowsProgress(Progress):
    """:class:`Progress` whose ETA is the sweep's measured estimate (when it has one)."""

    def __init__(self, total, *, left, **kw):
        self._left = left
        super().__init__(total, **kw)

    def status(self) -> str:
        text = super().status()
        left = self._left()
        if left is None or not self.total or self.done >= self.total:
            return text
        return re.sub(r", ETA [\d:]+", f", ETA {duration(left)}", text, count=1)


class _RowProducts:
    """The Hessian-vector products of one running row: ``text`` (checkpoint · probe spec), ``planned``
    (the probe's budget when it has one), their count and the time per product after the first (the
    set-up before it, building and checking the operator, is said apart)."""

    def __init__(self, text: str, planned: int | None):
        self.text, self.planned, self.n, self.n_first = text, planned, 0, 0
        self.t0 = self.said = time.perf_counter()
        self.first: float | None = None  # when the first products ended (n_first of them)

    def add(self, n: int, now: float) -> None:
        if self.first is None:
            self.first, self.n_first = now, n
        self.n += n

    def status(self, now: float) -> str:
        of = f"/{self.planned}" if self.planned else ""
        out = f"{self.text}: {self.n}{of} HVPs"
        if self.n > self.n_first:
            out += f", {(now - self.first) / (self.n - self.n_first):.3g} s/HVP"
        return out + f", set-up {self.first - self.t0:.2g} s, elapsed {duration(now - self.t0)}"


class SweepProgress:
    """Probes done / planned (ETA) and one line per finished checkpoint; silent when not ``enabled``.

    ``workers``: processes probing checkpoints at once (1: this process). ``pending``: each
    checkpoint's task keys ``(probe, spec)`` still to run, in trajectory order (the estimate's
    per-probe counts; without it the estimate uses the mean row). Rows reach :meth:`measured` (their
    seconds) before :meth:`probe_done` counts them."""

    def __init__(self, n_probes: int, n_checkpoints: int, enabled: bool = True, *, workers: int = 1, pending=None):
        self.enabled = enabled and n_probes > 0
        self.n_checkpoints, self.n_done, self.workers = n_checkpoints, 0, max(1, int(workers))
        self.n_probes, self._rows = n_probes, 0
        self._left = Counter(k for keys in pending or () for k in keys)
        self._unkeyed = 0 if pending is not None else n_probes  # rows to run whose probe is not known
        self._seconds: dict[tuple[str, str], list[float]] = {}
        self._loads: list[float] = []
        self._row: _RowProducts | None = None  # the products of the row started last
        self._running: dict[str, _RowProducts] = {}  # ... of the row running on each checkpoint
        self._first: tuple[float, float] | None = None  # (wall seconds to the first row, its measured seconds)
        self._t0 = time.perf_counter()
        self._p = _RowsProgress(
            n_probes,
            left=self.seconds_left,
            what="probe rows",
            unit="row",
            label="sweep",
            quiet=not self.enabled,
            plan=False,
        )

    def start_probe(self, label: str, task) -> None:
        """``task``: the :class:`~losslens.measure.probes.tasks.Task` about to run on checkpoint ``label``."""
        spec = f" {task.spec}" if task.spec else ""
        self._running[label] = self._row = _RowProducts(f"{label} · {task.probe}{spec}", task.opts.get("num_matvecs"))
        self._p.describe(self._row.text)

    def products(self, n: int, label: str | None = None) -> None:
        """``n`` more Hessian-vector products of the row running on checkpoint ``label`` (None: the row
        started last; workers run one row per checkpoint at a time): on a terminal the bar's text counts
        them; in a pipe a line every ``every`` seconds of a long row (a whole-model curvature row runs
        minutes)."""
        row = self._row if label is None else self._running.get(label)
        if row is None or not self.enabled:
            return
        now = time.perf_counter()
        row.add(n, now)
        self._p.describe(row.status(now))
        if now - max(row.t0, row.said) >= self._p.every and not self._p.live:
            self._p.echo(row.status(now))
            row.said = now

    def measured(self, row) -> None:
        """A :class:`~losslens.measure.probes.rows.ProbeRow` arrived: its seconds join its probe's mean and
        the checkpoint's load (carried by its first row) the loads; a failed row only counts as done."""
        key = (row.probe, row.spec)
        if self._left[key] > 0:
            self._left[key] -= 1
        elif self._unkeyed > 0:
            self._unkeyed -= 1
        load = (row.extra or {}).get("load_seconds")
        if load is not None:
            self._loads.append(float(load))
        if row.status != "ok":
            return
        self._seconds.setdefault(key, []).append(float(row.seconds or 0.0))
        if self._first is None:
            self._first = (time.perf_counter() - self._t0, float(row.seconds or 0.0))

    def _load(self) -> float:
        """Seconds to load a checkpoint: the mean of the loads after each worker's first (which also
        imports the model's code); 0 until one is measured."""
        warm = self._loads[min(self.workers, self.n_checkpoints) :]
        return sum(warm) / len(warm) if warm else 0.0

    def seconds_left(self) -> float | None:
        """The estimated seconds to the end: each pending row at its probe's mean measured seconds (a
        probe not measured yet: the mean row) and each checkpoint still to load at :meth:`_load`, over
        the workers the remaining checkpoints keep busy; None before the first measured row."""
        if not self._seconds:
            return None
        means = {k: sum(v) / len(v) for k, v in self._seconds.items()}
        every = [x for v in self._seconds.values() for x in v]
        mean_row = sum(every) / len(every)
        work = sum(n * means.get(k, mean_row) for k, n in self._left.items()) + self._unkeyed * mean_row
        work += max(0, self.n_checkpoints - len(self._loads)) * self._load()
        return work / max(1, min(self.workers, self.n_checkpoints - self.n_done))

    def probe_done(self, n: int = 1) -> None:
        if self._rows == 0 and n > 0:
            self._planned()
        self._rows += n
        self._p.update(n)

    def _planned(self) -> None:
        """The planned line, once the first row is in: the rows, the workers and the time the first
        row's own seconds imply; the wall time before it (starting the workers, the first load with
        its imports) is said, not extrapolated."""
        on = f" on {self.workers} workers" if self.workers > 1 else ""
        head = f"planned: {self.n_probes} rows for probe rows{on}"
        if self._first is None:  # the first rows failed: nothing measured yet
            self._p.echo(f"{head}; no estimate yet (no row measured)")
            return
        wall, first = self._first
        planned = first * self.n_probes / max(1, min(self.workers, self.n_checkpoints))
        self._p.echo(
            f"{head}, {estimate(planned)} (first row {first:.3g} s; not counted: {wall - first:.2g} s of "
            "start-up and first load before it; rough until each probe has run once, refined as rows finish)"
        )

    def checkpoint_done(self, label: str) -> None:
        self._running.pop(label, None)
        self.n_done += 1
        left = self.seconds_left()
        rest = f", ~{duration(left)} left" if left is not None and self.n_done < self.n_checkpoints else ""
        self._p.echo(f"checkpoint {label} done ({self.n_done}/{self.n_checkpoints}){rest}")

    def close(self) -> None:
        self._p.close()


__all__ = ["SweepProgress"]

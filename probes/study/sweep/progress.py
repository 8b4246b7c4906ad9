"""The sweep's progress display: :class:`SweepProgress`, the probes done / planned with an ETA through
the one progress helper (:mod:`losslens.geometry.base.progress`: a live bar on a terminal, plain lines every
few seconds in a pipe or a log, one line per finished checkpoint), on stderr."""

from __future__ import annotations

from losslens.geometry.base.progress import Progress


class SweepProgress:
    """Probes done / planned (ETA) and one line per finished checkpoint; silent when not ``enabled``."""

    def __init__(self, n_probes: int, n_checkpoints: int, enabled: bool = True):
        self.enabled = enabled and n_probes > 0
        self.n_checkpoints, self.n_done = n_checkpoints, 0
        self._p = Progress(n_probes, what="probe rows", unit="row", label="sweep", quiet=not self.enabled)

    def start_probe(self, label: str, task) -> None:
        """``task``: the :class:`~losslens.measure.probes.tasks.Task` about to run on checkpoint ``label``."""
        spec = f" {task.spec}" if task.spec else ""
        self._p.describe(f"{label} · {task.probe}{spec}")

    def probe_done(self, n: int = 1) -> None:
        self._p.update(n)

    def checkpoint_done(self, label: str) -> None:
        self.n_done += 1
        self._p.echo(f"checkpoint {label} done ({self.n_done}/{self.n_checkpoints})")

    def close(self) -> None:
        self._p.close()


__all__ = ["SweepProgress"]

"""The sweep's progress display: :class:`SweepProgress`."""

from __future__ import annotations


class SweepProgress:
    """Rich progress display: one bar over probes (ETA) and one over checkpoints; no-op when quiet."""

    def __init__(self, n_probes: int, n_checkpoints: int, enabled: bool = True):
        self.enabled = enabled and n_probes > 0
        self._p = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._p = Progress(
            TextColumn("{task.description:<44}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._ck = self._p.add_task("checkpoints", total=n_checkpoints)
        self._pr = self._p.add_task("probes", total=n_probes)
        self._p.start()

    def start_probe(self, label: str, task) -> None:
        """``task``: the :class:`~losslens.measure.probes.tasks.Task` about to run on checkpoint ``label``."""
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


__all__ = ["SweepProgress"]

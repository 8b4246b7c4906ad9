"""What a sweep call did: :class:`SweepReport` (counts, times, failures, the exit status), and
:class:`SweepError` (the sweep cannot start)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from losslens.measure.probes.rows import error_type

from losslens.geometry.base.errors import LosslensError

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
        s = (
            f"{self.n_checkpoints} checkpoints, {self.n_tasks} rows: {self.n_ok} ok, {self.n_failed} failed, "
            f"{self.n_skipped} already done; {self.seconds:.1f} s ({how}) -> {self.store}"
        )
        if self.kept_failures:
            s += (
                f"; {len(self.kept_failures)} of the rows already done are stored as failed "
                "(--retry-failed / retry_failed=True reruns them)"
            )
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


__all__ = ["SweepError", "SweepReport", "EXIT_SOME_FAILED", "EXIT_ALL_FAILED"]

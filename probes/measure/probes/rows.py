"""The rows a sweep writes: :class:`ProbeRow` (one probe of one checkpoint), :func:`metric` (one
measured number) and :func:`error_type` (the exception class named in a failed row's message)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from losslens.measure.probes.tasks import Task

__all__ = ["ProbeRow", "metric", "error_type", "row_converged", "hvp_error_flag"]


@dataclass
class ProbeRow:
    """One measured (or failed) probe of one checkpoint, as the executor hands it to the store.

    ``metrics``: list of ``{"metric", "value", "stderr", "ci_low", "ci_high"[, "spec"][, "converged"]}``
    (missing error bars are None; an optional ``"spec"`` overrides the row's spec in the tidy table;
    ``"converged"`` is the estimator's own flag for that value). ``converged``: the row's flag (None:
    the probe has no convergence criterion; default: all its metrics' flags). ``seconds``: wall time
    of the probe. ``n_hvp``: Hessian-vector products spent. ``threads``: torch intra-op threads the
    probe ran with (results can differ in the last bits between thread counts).
    """

    checkpoint: str
    probe: str
    spec: str
    status: str = "ok"
    metrics: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    n_hvp: int = 0
    seconds: float = 0.0
    error: str | None = None
    seed: int | None = None
    config_hash: str = ""
    converged: bool | None = None
    threads: int | None = None

    @classmethod
    def failed(
        cls, checkpoint: str, task: Task, error: BaseException | str, seconds: float = 0.0, seed=None
    ) -> "ProbeRow":
        msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return cls(checkpoint, task.probe, task.spec, "failed", [], {}, 0, seconds, msg, seed, task.config_hash)


def metric(
    name: str, value, stderr=None, ci_low=None, ci_high=None, spec: str | None = None, converged: bool | None = None
) -> dict:
    """A metrics entry (floats or None; ``converged`` only when the estimator has a criterion)."""
    d = {"metric": name, "value": _f(value), "stderr": _f(stderr), "ci_low": _f(ci_low), "ci_high": _f(ci_high)}
    if spec is not None:
        d["spec"] = spec
    if converged is not None:
        d["converged"] = bool(converged)
    return d


def hvp_error_flag(op) -> dict:
    """``{"error_warning": ...}`` for a row's ``extra`` when the operator's measured product error is
    over the default tolerance (:func:`losslens.lm.models.curvature.error_warning`: the error, its cause
    and the fix), else ``{}`` (rows of exact backends stay as they were)."""
    from losslens.lm.models.curvature import error_warning

    warning = error_warning(op.checked() if hasattr(op, "checked") else None, op.param_dtype)
    return {"error_warning": warning} if warning else {}


def row_converged(row: ProbeRow) -> bool | None:
    """The row's convergence flag: ``row.converged``, else all of its metrics' flags (None when none has one)."""
    if row.converged is not None:
        return bool(row.converged)
    flags = [m["converged"] for m in row.metrics if m.get("converged") is not None]
    return all(flags) if flags else None


_PREFIX = re.compile(r"^loading checkpoint .*? failed: ")
_TYPE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Unavailable))\b")


def error_type(message: str | None) -> str:
    """The exception class a failed row's message starts with (after ``loading checkpoint 'x'
    failed:``), e.g. ``"CorruptCheckpointError"``; ``"other"`` when there is none."""
    m = _TYPE.match(_PREFIX.sub("", (message or "").strip()))
    return m.group(1).rsplit(".", 1)[-1] if m else "other"


def _f(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None if math.isnan(x) else x

"""The rows of one monitor measurement: one sweep task run on the live model (:func:`run_task`),
the precision floor each curvature row is flagged against (:func:`flag_floor`), and the flat values
read back from the store for the trainer's loggers (:func:`stored_values`). Used by
:meth:`losslens.study.monitor.monitor.RobustnessMonitor.measure`.
"""

from __future__ import annotations

import json
import math
import time
import warnings

import torch

from losslens.study.sweep.runner import PROBE_FUNCS
from losslens.study.sweep.store import Store
from losslens.measure.probes.eigen import PROBE as EIGEN
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.rows import ProbeRow
from losslens.measure.probes.state import CheckpointState
from losslens.measure.probes.trace import PROBE as TRACE

from losslens.study.monitor.settings import MonitorError, MonitorSettings

__all__ = ["run_task", "flag_floor", "stored_values"]


def run_task(
    st: CheckpointState, task, seed: int, settings: MonitorSettings, train_loss: float | None, extra
) -> ProbeRow:
    """Run one sweep task on the live model's state ``st`` (no_grad unless it needs curvature) as the
    sweep runs it; a failure or a non-finite value is a warning and a failed row (training goes on).
    ``seed``: the plan's seed, for rows whose probe sets none; ``train_loss`` and ``extra`` go into
    the loss row's ``extra``."""
    t1 = time.perf_counter()
    try:
        if task.curvature:
            row = PROBE_FUNCS[task.probe](st, task)
        else:
            with torch.no_grad():
                row = PROBE_FUNCS[task.probe](st, task)
        bad = [m["metric"] for m in row.metrics if m["value"] is None or not math.isfinite(m["value"])]
        if bad:
            raise MonitorError(f"{task.probe} {task.spec}: non-finite value for {bad}")
    except Exception as exc:  # a failed probe is a failed row; training goes on
        warnings.warn(
            f"monitor: {task.probe} {task.spec} failed at {st.label}: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        row = ProbeRow.failed(st.label, task, exc)
    row.seconds = time.perf_counter() - t1
    row.config_hash = task.config_hash
    row.checkpoint = st.label
    row.threads = torch.get_num_threads()
    if row.seed is None:
        row.seed = seed
    if row.status == "ok":
        flag_floor(row, settings)
        if task.probe == LOSS.name:
            row.extra = {
                **row.extra,
                **({"train_loss": float(train_loss)} if train_loss is not None else {}),
                **dict(extra or {}),
            }
    return row


def flag_floor(row: ProbeRow, settings: MonitorSettings) -> None:
    """Precision floor: trace CI relative half-width ≤ ``trace_ci_floor``; λ_max converged."""
    if row.probe == TRACE.name:
        m = row.metrics[0]
        half = 0.5 * (m["ci_high"] - m["ci_low"]) / abs(m["value"]) if m["value"] else math.inf
        row.extra = {
            **row.extra,
            "rel_ci_half_width": half,
            "floor": settings.trace_ci_floor,
            "below_floor": bool(half > settings.trace_ci_floor),
        }
    elif row.probe == EIGEN.name:
        ok = all(bool(m.get("converged")) for m in row.metrics)
        res = row.extra.get("residuals") or [math.nan]
        lam = row.metrics[0]["value"]
        row.extra = {
            **row.extra,
            "rel_residual": float(res[0]) / abs(lam) if lam else math.inf,
            "floor": settings.lanczos_tol,
            "below_floor": not ok,
        }


def stored_values(store: Store, run: str, label: str) -> dict[str, float]:
    """Flat values of checkpoint ``label`` of ``run``, read back from the store (for loggers):
    ``loss``, ``dq/<spec>``, ``trace``, ``trace_rel_ci``, ``lambda_max``, ``below_floor``."""
    df = store.results(include_failed=False)
    df = df[(df["run"] == run) & (df["checkpoint"] == label)]
    raw = store.raw()
    raw = raw[(raw["run"] == run) & (raw["checkpoint"] == label)]
    out: dict[str, float] = {}
    for _, r in df.iterrows():
        if r["probe"] == LOSS.name and r["metric"] == LOSS.metric:
            out["loss"] = float(r["value"])
        elif r["probe"] == QUANT.name and r["metric"] == QUANT.metric:
            out[f"dq/{r['spec']}"] = float(r["value"])
        elif r["probe"] == TRACE.name:
            out["trace"] = float(r["value"])
        elif r["probe"] == EIGEN.name and r["metric"] == EIGEN.metric:
            out["lambda_max"] = float(r["value"])
    below = 0.0
    for _, r in raw.iterrows():
        ex = json.loads(r["extra"] or "{}")
        if r["probe"] == TRACE.name and "rel_ci_half_width" in ex:
            out["trace_rel_ci"] = float(ex["rel_ci_half_width"])
        below = max(below, float(bool(ex.get("below_floor"))))
    if "trace" in out or "lambda_max" in out:
        out["below_floor"] = below
    return out

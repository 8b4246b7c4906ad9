"""The robustness monitor of a training run: ΔQ, loss and curvature of the live model, written to a
sweep store while training goes on (:class:`RobustnessMonitor`).

The three front ends -- :class:`~losslens.study.monitor.hf.RobustnessCallback` (transformers.Trainer),
:class:`~losslens.study.monitor.lightning_callback.LightningRobustnessCallback` and the plain loop's
``monitor.step(model, step, lr=...)`` -- all call :meth:`RobustnessMonitor.measure`.

One measurement at step t (label ``step-{t:06d}``), inside :func:`losslens.study.monitor.training_state.preserved`
(RNG states, module modes, ``requires_grad`` and ``.grad`` restored after; the optimizer is never
seen), runs the tasks of :meth:`MonitorSettings.plan` through the sweep's own probe functions
(:data:`losslens.study.sweep.runner.PROBE_FUNCS`) on the live model:

* ``loss``: FP loss on the held-out eval set (no_grad); ``quant`` per spec: ΔQ on the same set
  (a quantized deep copy of the model, no_grad);
* ``trace``: Hutchinson with ``trace_hvps`` HVPs, ``eigen``: λ_max by ≤ ``lanczos_steps`` Lanczos
  steps, on the curvature set (the only part that needs autograd).

Cost per measurement: (1 + #specs) forward passes over the eval set, #specs quantizations, and
``trace_hvps`` + ≤ ``lanczos_steps`` HVPs (≈ 2–3 gradients each) on the curvature set. Memory
beside training: max(one model copy + one eval forward, the curvature estimators' plan), checked by
:meth:`RobustnessMonitor.prepare` before the first step (:class:`MonitorMemoryError`).

Rows go to the store exactly as a sweep writes them (same schema, tasks and config hashes), with
the checkpoint's step, tokens and the LR *in effect at that step* (the LR the update that produced
step t used). A rerun or resumed run skips the steps already stored. The settings (and the memory
plan, and the time spent) are in the store's metadata under ``monitor:<run>``; the alarm's marker
under ``monitor_alarm:<run>``.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from losslens.lm.core.tokenset import TokenSet
from losslens.study.sweep.datasets import data_hashes
from losslens.study.sweep.store import Store
from losslens.measure.probes.loss import PROBE as LOSS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.rows import ProbeRow
from losslens.measure.probes.state import CheckpointState

from losslens.study.monitor.alarm import Alarm, AlarmEvent
from losslens.study.monitor.memory import check_memory
from losslens.study.monitor.monitor_rows import run_task, stored_values
from losslens.study.monitor.settings import MonitorError, MonitorSettings
from losslens.study.monitor.training_state import preserved

__all__ = ["RobustnessMonitor", "QuantizationAlarm", "Measurement"]

log = logging.getLogger("losslens.study.monitor")


class QuantizationAlarm(UserWarning):
    """Warned once per run when the alarm fires (:mod:`losslens.study.monitor.alarm`)."""


@dataclass(frozen=True)
class _Point:
    """A live checkpoint as the store records it (no weights on disk: ``kind='live'``)."""

    label: str
    step: int
    tokens: int | None
    lr: float | None
    kind: str = "live"
    location: str | None = None

    def to_dict(self) -> dict:
        return dict(label=self.label, step=self.step, tokens=self.tokens, lr=self.lr, kind=self.kind)


@dataclass
class Measurement:
    """What one measurement gave: ``values`` (flat, for loggers), the rows written, its wall time."""

    step: int
    values: dict[str, float]
    rows: list[ProbeRow]
    seconds: float
    alarm: AlarmEvent | None = None


def _token_set(x, name: str) -> TokenSet:
    if isinstance(x, TokenSet):
        return x
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, (list, tuple)) and x and all(isinstance(b, torch.Tensor) for b in x):
        shapes = {tuple(b.shape) for b in x}
        if len(shapes) != 1:
            raise MonitorError(f"{name}: every batch must have the same [batch, seq] shape, got {sorted(shapes)}")
        t = torch.stack(list(x))
    else:
        raise MonitorError(
            f"{name} must be a TokenSet, a [n_batches, batch, seq] tensor or a list of [batch, seq] "
            f"tensors, got {type(x).__name__}"
        )
    if t.ndim == 2:
        t = t[None]
    if t.ndim != 3 or t.dtype not in (torch.long, torch.int32, torch.int64) or min(t.shape) == 0 or t.shape[2] < 2:
        raise MonitorError(
            f"{name} must hold integer token ids [n_batches, batch, seq >= 2], got {t.dtype} {tuple(t.shape)}"
        )
    return TokenSet(t.long(), name)


class RobustnessMonitor:
    """Measures ΔQ, loss and curvature of a model during training into a sweep store.

    Args:
        store: the SQLite store (path or :class:`~losslens.study.sweep.store.Store`); created if missing,
            resumed if it holds this run.
        eval_set: held-out token ids (TokenSet, [n, b, s] tensor or list of [b, s]): ΔQ and loss.
        curvature_set: token ids for trace and λ_max (default: the eval set's first batch).
        calibration_set: only for calibrated quantizers (GPTQ, AWQ); disjoint from ``eval_set``.
        settings: :class:`MonitorSettings` (or its fields as keyword arguments).
        run: the run's name in the store.
        tokens_per_step: tokens per optimizer step, to record tokens seen when the caller does not
            pass ``tokens``.
        on_alarm: called once as ``on_alarm(event)`` when the alarm fires.
    """

    def __init__(
        self,
        store: "str | Path | Store",
        eval_set,
        curvature_set=None,
        calibration_set=None,
        settings: MonitorSettings | None = None,
        run: str = "monitor",
        tokens_per_step: int | None = None,
        on_alarm: Callable[[AlarmEvent], Any] | None = None,
        **overrides,
    ):
        if settings is not None and overrides:
            raise MonitorError(f"give either settings or keyword settings, not both ({sorted(overrides)})")
        unknown = sorted(set(overrides) - set(MonitorSettings.__dataclass_fields__))
        if unknown:
            raise MonitorError(
                f"unknown monitor setting(s) {unknown}; valid: {', '.join(MonitorSettings.__dataclass_fields__)}"
            )
        self.settings = settings if settings is not None else MonitorSettings(**overrides)
        ev = _token_set(eval_set, "eval_set")
        cv = _token_set(curvature_set, "curvature_set") if curvature_set is not None else ev.subset(1, "curvature")
        sets = {"eval": ev, "curvature": cv}
        specs_need_cal = [s for s in self.settings.specs if s.split(":")[0] in ("gptq", "awq")]
        if calibration_set is not None:
            sets["calibration"] = _token_set(calibration_set, "calibration_set")
        elif specs_need_cal:
            raise MonitorError(
                f"{specs_need_cal} need a calibration_set (token ids disjoint from eval_set); RTN and INT8 specs do not"
            )
        self.token_sets = sets
        cal = sets.get("calibration")
        self.run = str(run)
        self.plan = self.settings.plan(
            tuple(ev.tokens.shape),
            tuple(cv.tokens.shape),
            tuple(cal.tokens.shape) if cal is not None else None,
            name=self.run,
        )
        self.tasks = self.plan.tasks()
        self.data_hash, self.data_hashes = data_hashes(sets)
        self.store = store if isinstance(store, Store) else Store(store)
        self.store.bind(self.plan, self.data_hash, self.data_hashes, run=self.run)
        self.tokens_per_step = tokens_per_step
        self.on_alarm = on_alarm
        s = self.settings
        self.alarm = (
            Alarm(s.alarm_spec, s.alarm_threshold, s.alarm_window, s.alarm_min_improvement, s.alarm_lr_drop)
            if s.alarm_spec
            else None
        )
        self.memory: dict | None = None
        self.monitor_seconds = 0.0
        self.prepare_seconds = 0.0
        self.n_measured = 0
        prior = self.store.meta.get(f"monitor:{self.run}")  # a resumed run keeps the skips counted before
        prior = prior if isinstance(prior, Mapping) else {}
        self.skipped_steps: list[int] = [int(t) for t in prior.get("skipped_steps") or []]
        self.n_skipped = int(prior.get("skipped_for_time") or len(self.skipped_steps))
        self._last_cost = 0.0
        self._t0: float | None = None
        self._prepared = False
        self._resume()

    # ----------------------------------------------------------------- set-up
    def _resume(self) -> None:
        """Rebuild the alarm's history (and whether it already fired) from this run's stored rows."""
        meta = self.store.meta
        if self.alarm is None:
            return
        marker = meta.get(f"monitor_alarm:{self.run}")
        if isinstance(marker, Mapping):
            self.alarm.fired = AlarmEvent(**{k: marker[k] for k in AlarmEvent.__dataclass_fields__})
        df = self.store.results(include_failed=False)
        df = df[(df["run"] == self.run) & (df["data_hash"] == self.data_hash)]
        loss = df[(df["probe"] == LOSS.name) & (df["metric"] == LOSS.metric)].set_index("step")["value"]
        dq = df[(df["probe"] == QUANT.name) & (df["spec"] == self.alarm.spec) & (df["metric"] == QUANT.metric)]
        dq = dq.set_index("step")["value"]
        lrs = df.groupby("step")["lr"].first()
        for step in sorted(set(loss.index) & set(dq.index)):
            self.alarm.history.append((int(step), float(loss[step]), float(dq[step])))
            lr = lrs.get(step)
            if lr is not None and math.isfinite(lr):
                self.alarm.annealing(float(lr))  # the peak LR seen before the resume

    def prepare(self, model: nn.Module) -> dict:
        """Check, before training starts, that a measurement fits beside training in memory
        (raises :class:`~losslens.study.monitor.settings.MonitorMemoryError` otherwise), run the
        second-order check of the architecture once, and record the settings and the memory plan
        in the store. Idempotent; RNG states, modes and gradients are left as they were."""
        if self._prepared:
            return self.memory or {}
        t0 = time.perf_counter()
        if self._t0 is None:
            self._t0 = t0
        with preserved(model):
            self.memory = check_memory(model, self.settings, self.token_sets)
        self._prepared = True
        self.prepare_seconds = time.perf_counter() - t0
        self.monitor_seconds += self.prepare_seconds
        self._record_meta()
        return self.memory

    def _record_meta(self) -> None:
        self.store.set_meta(
            {
                f"monitor:{self.run}": {
                    "settings": self.settings.to_dict(),
                    "memory": self.memory,
                    "data_hashes": self.data_hashes,
                    "measured": self.n_measured,
                    "skipped_for_time": self.n_skipped,
                    "skipped_steps": self.skipped_steps,
                    "monitor_seconds": round(self.monitor_seconds, 3),
                    "prepare_seconds": round(self.prepare_seconds, 3),
                }
            }
        )

    # ----------------------------------------------------------------- when
    def due(self) -> bool:
        """Whether a measurement now keeps the monitor within its time budget: the first always;
        later ones when (time spent measuring so far + the last measurement's cost) ≤ budget × the
        training time elapsed (wall time since :meth:`prepare` or the first call, minus the
        monitor's own). The one-off :meth:`prepare` is not charged here (it is reported in
        :meth:`summary` and the store's metadata)."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        if self.n_measured == 0:
            return True
        train = (now - self._t0) - self.monitor_seconds
        spent = self.monitor_seconds - self.prepare_seconds
        return spent + self._last_cost <= self.settings.time_budget * train

    def step(
        self,
        model: nn.Module,
        step: int,
        lr: float | None = None,
        *,
        loss: float | None = None,
        tokens: int | None = None,
    ) -> Measurement | None:
        """The plain loop's call after optimizer step ``step`` (1-based: the weights after update
        ``step``; ``lr``: the LR that update used; ``loss``: its training loss; ``tokens``: tokens
        seen, default ``step × tokens_per_step``). Measures when ``step`` is a multiple of
        ``settings.every`` (default every 50 steps here) and the time budget allows; returns the
        :class:`Measurement` or None. The first call runs :meth:`prepare` (the memory check);
        call ``prepare(model)`` yourself before the loop to be refused before the first update."""
        if not self._prepared:
            self.prepare(model)
        every = self.settings.every or 50
        if step % every:
            return None
        return self.maybe_measure(model, step, lr=lr, tokens=tokens, train_loss=loss)

    def maybe_measure(self, model: nn.Module, step: int, **kw) -> Measurement | None:
        """:meth:`measure` if :meth:`due`, else count the skip and return None."""
        if not self.due():
            self.n_skipped += 1
            self.skipped_steps.append(int(step))
            log.info(
                "monitor: step %d skipped to stay within the time budget (%.0f%%)",
                step,
                100 * self.settings.time_budget,
            )
            self._record_meta()
            return None
        return self.measure(model, step, **kw)

    # ----------------------------------------------------------------- what
    def measure(
        self,
        model: nn.Module,
        step: int,
        lr: float | None = None,
        tokens: int | None = None,
        train_loss: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Measurement:
        """Measure the live ``model`` at optimizer step ``step`` and write the rows (steps already
        stored with the same settings and data are read back, not recomputed). Training state is
        left exactly as it was (:func:`~losslens.study.monitor.training_state.preserved`)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise MonitorError(f"step must be a non-negative integer, got {step!r}")
        if not self._prepared:
            self.prepare(model)
        t0 = time.perf_counter()
        label = f"step-{step:06d}"
        if tokens is None and self.tokens_per_step is not None:
            tokens = int(step * self.tokens_per_step)
        self.store.add_checkpoints([_Point(label, int(step), tokens, lr)], run=self.run)
        pending = self.store.pending(label, self.tasks, self.data_hash, run=self.run)
        rows: list[ProbeRow] = []
        with preserved(model):
            st = CheckpointState(model, self.plan, self.token_sets)
            st.label = label
            for task in pending:
                rows.append(run_task(st, task, self.plan.seed, self.settings, train_loss, extra))
            del st
        for row in rows:
            self.store.write(row, data_hash=self.data_hash, plan_hash=self.plan.hash, run=self.run)
        values = stored_values(self.store, self.run, label)
        event = None
        if self.alarm is not None and "loss" in values and f"dq/{self.alarm.spec}" in values:
            rate, event = self.alarm.update(step, values["loss"], values[f"dq/{self.alarm.spec}"], lr)
            if rate is not None:
                values["alarm_rate"] = rate
            values["alarm"] = float(self.alarm.fired is not None)
            if event is not None:
                self._fire(event)
        dt = time.perf_counter() - t0
        self.monitor_seconds += dt
        self._last_cost = dt
        self.n_measured += 1
        values["seconds"] = dt
        self._record_meta()
        return Measurement(step, values, rows, dt, event)

    def _fire(self, event: AlarmEvent) -> None:
        """Warn once (a :class:`QuantizationAlarm`; the log gets it at INFO, so a console with both shows
        it once), write the store marker, call the user's hook."""
        msg = event.message()
        warnings.warn(msg, QuantizationAlarm, stacklevel=3)
        log.info(msg)
        self.store.set_meta({f"monitor_alarm:{self.run}": event.to_dict()})
        if self.on_alarm is not None:
            self.on_alarm(event)

    def summary(self) -> dict:
        """Time spent (prepare and measurements), measurements taken and skipped, the alarm."""
        return {
            "run": self.run,
            "measured": self.n_measured,
            "skipped_for_time": self.n_skipped,
            "skipped_steps": list(self.skipped_steps),
            "monitor_seconds": self.monitor_seconds,
            "prepare_seconds": self.prepare_seconds,
            "alarm": None if self.alarm is None or self.alarm.fired is None else self.alarm.fired.to_dict(),
        }

    def close(self) -> None:
        self._record_meta()
        self.store.close()

"""The robustness monitor as a ``transformers.TrainerCallback`` (:class:`RobustnessCallback`).

    cb = RobustnessCallback("run.sqlite", eval_set=heldout_ids, specs=["rtn:3", "rtn:2:g32"])
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=[cb])
    cb.attach(trainer)        # optional: values reach the trainer's loggers through trainer.log
    trainer.train()

When it measures: at each evaluation (``on_evaluate``) by default; with ``every=N`` after every N-th
optimizer step instead (``on_step_end``). Steps are ``state.global_step`` (optimizer updates).
Before the first step (``on_train_begin``) it checks that a measurement fits beside training in
memory and refuses (:class:`~losslens.study.monitor.settings.MonitorMemoryError`) otherwise.

The LR recorded at step t is the one in effect *for the update that produced step t*: read from
the optimizer's first param group in ``on_step_begin`` (before the scheduler steps). Reading
``lr_scheduler.get_last_lr()`` after the step would give step t + 1's LR (the off-by-one of the
Trainer's own ``learning_rate`` log). Tokens: ``state.num_input_tokens_seen`` when the Trainer
counts them (``include_num_input_tokens_seen``), else ``step × tokens_per_step`` when given.

Values reach the loggers in one of two ways (the callback has no handle to the Trainer):

* **with** :meth:`RobustnessCallback.attach` (or ``trainer=`` at construction): right after each
  measurement through ``trainer.log({...})``, so every ``report_to`` integration (TensorBoard,
  W&B, ...) and ``state.log_history`` get them at that step;
* **without**: they are appended to ``state.log_history`` at once and injected into the ``logs``
  of the next ``on_log`` call, where callbacks that run after this one see them.

Keys: ``monitor/loss``, ``monitor/dq/<spec>``, ``monitor/trace``, ``monitor/trace_rel_ci``,
``monitor/lambda_max``, ``monitor/below_floor``, ``monitor/alarm``, ``monitor/alarm_rate``,
``monitor/seconds``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from losslens.study.monitor.monitor import Measurement, RobustnessMonitor

__all__ = ["RobustnessCallback"]


class RobustnessCallback(TrainerCallback):
    """Measures ΔQ, loss and curvature of the Trainer's model at each evaluation (or every N
    steps) into a sweep store. Arguments: those of :class:`~losslens.study.monitor.RobustnessMonitor`
    (``store``, ``eval_set``, ``curvature_set``, ``settings`` or its fields such as ``specs``,
    ``every``, ``time_budget``; ``run``, ``tokens_per_step``, ``on_alarm``) plus ``trainer``."""

    def __init__(
        self, store, eval_set, curvature_set=None, trainer=None, monitor: RobustnessMonitor | None = None, **kwargs
    ):
        self.monitor = monitor if monitor is not None else RobustnessMonitor(store, eval_set, curvature_set, **kwargs)
        self.trainer = trainer
        self._lr: float | None = None
        self._pending: dict[str, float] = {}
        self.measurements: list[Measurement] = []

    def attach(self, trainer) -> "RobustnessCallback":
        """Register with ``trainer`` (if not yet) and log through ``trainer.log``."""
        self.trainer = trainer
        if not any(cb is self for cb in trainer.callback_handler.callbacks):
            trainer.add_callback(self)
        return self

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and state.is_world_process_zero:
            self.monitor.prepare(model)

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is not None and optimizer.param_groups:
            self._lr = float(optimizer.param_groups[0]["lr"])  # read only: the LR of this update

    def on_step_end(self, args, state, control, model=None, **kwargs):
        every = self.monitor.settings.every
        if every and state.global_step % every == 0:
            self._measure(state, model, None)

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if self.monitor.settings.every is None:
            self._measure(state, model, metrics)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending and logs is not None:
            logs.update(self._pending)
            self._pending = {}

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor._record_meta()

    # ------------------------------------------------------------------ the measurement
    def _measure(self, state, model, metrics) -> None:
        if model is None or not state.is_world_process_zero:
            return
        step = int(state.global_step)
        tokens = int(state.num_input_tokens_seen) if getattr(state, "num_input_tokens_seen", 0) else None
        extra: dict[str, Any] = {}
        if metrics:
            extra["trainer_metrics"] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        train_loss = next((h["loss"] for h in reversed(state.log_history) if "loss" in h), None)
        m = self.monitor.maybe_measure(model, step, lr=self._lr, tokens=tokens, train_loss=train_loss, extra=extra)
        if m is None:
            return
        self.measurements.append(m)
        values = {f"monitor/{k}": float(v) for k, v in m.values.items()}
        if self.trainer is not None:
            self.trainer.log(dict(values))
        else:
            state.log_history.append({**values, "step": step})
            self._pending.update(values)

"""A quantization-robustness monitor for training runs (issue #29).

Measures ΔQ (RTN by default), FP loss and a cheap curvature signal (Hutchinson trace, λ_max by
Lanczos) of the live model at each evaluation or every N steps, writes sweep-store rows (so
``losslens report`` / ``correlate`` read a live or finished run), logs the values to the trainer's
loggers, and raises a one-time alarm when ΔQ grows fast per unit of loss improvement. Training
continues bit-identically (RNG states, modes and gradients restored; the optimizer never touched).

Front ends:

* :class:`RobustnessCallback` -- ``transformers.TrainerCallback`` (needs ``transformers``,
  ``accelerate``: the ``monitor`` extra);
* :class:`LightningRobustnessCallback` -- ``lightning.pytorch.Callback`` (needs ``lightning``);
* :class:`RobustnessMonitor` -- plain loops: ``monitor.step(model, step, lr=...)``.

Modules: :mod:`.settings` (what is measured, fixed before training), :mod:`.state` (what is
restored), :mod:`.memory` (the fit check), :mod:`.alarm`, :mod:`.monitor` (the measurement), :mod:`.rows`
(one task run on the live model, its precision floor, the values read back),
:mod:`.hf`, :mod:`.lightning_callback`.
"""

from __future__ import annotations

from losslens.study.monitor.alarm import Alarm, AlarmEvent, alarm_rate
from losslens.study.monitor.monitor import Measurement, QuantizationAlarm, RobustnessMonitor
from losslens.study.monitor.settings import DEFAULT_SPECS, MonitorError, MonitorMemoryError, MonitorSettings
from losslens.study.monitor.training_state import preserved

__all__ = [
    "RobustnessMonitor",
    "RobustnessCallback",
    "LightningRobustnessCallback",
    "MonitorSettings",
    "MonitorError",
    "MonitorMemoryError",
    "QuantizationAlarm",
    "Measurement",
    "Alarm",
    "AlarmEvent",
    "alarm_rate",
    "preserved",
    "DEFAULT_SPECS",
]


def __getattr__(name: str):
    # the framework callbacks import transformers / lightning: only when asked for
    if name == "RobustnessCallback":
        from losslens.study.monitor.hf import RobustnessCallback

        return RobustnessCallback
    if name == "LightningRobustnessCallback":
        from losslens.study.monitor.lightning_callback import LightningRobustnessCallback

        return LightningRobustnessCallback
    raise AttributeError(f"module 'losslens.study.monitor' has no attribute {name!r}")

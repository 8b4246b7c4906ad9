"""The monitor for the embedded tiny trajectories (``losslens train-tiny --monitor``, the demo):
its held-out token sets, a :class:`~losslens.study.monitor.RobustnessMonitor` for one
:class:`~losslens.lm.train.config.TrainConfig`, and :func:`train_tiny_watched`, ``losslens train-tiny``'s
whole job (:func:`~losslens.lm.train.train_settings.train_runs` with the monitor of :class:`WatchSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from losslens.lm.data import token_sets_from_stream
from losslens.lm.shared_settings import settings
from losslens.lm.train.config import TrainError
from losslens.lm.train.train_settings import TrainRuns, TrainSettings, train_runs

from losslens.study.monitor.monitor import RobustnessMonitor

__all__ = [
    "tiny_monitor_sets",
    "tiny_monitor",
    "TINY_EVAL",
    "TINY_CURVATURE",
    "WatchSettings",
    "WatchedRuns",
    "train_tiny_watched",
]

#: (n_batches, batch) of the monitor's eval and curvature sets for the tiny runs; seq = the run's.
TINY_EVAL = (4, 16)
TINY_CURVATURE = (1, 4)


def tiny_monitor_sets(config, out_dir: str | Path, data_dir: str | Path, seed: int = 0) -> dict:
    """``{"eval", "curvature"}`` token sets cut (disjoint) from the held-out stream cached in
    ``data_dir`` by :func:`losslens.lm.train.tiny_data.prepare_data` (run first, into ``out_dir``, if needed)."""
    from safetensors.torch import load_file

    from losslens.lm.train.tiny_data import prepare_data

    data_dir = Path(data_dir)
    if not (data_dir / "streams.safetensors").is_file():
        prepare_data(config, out_dir, data_dir)
    held = load_file(str(data_dir / "streams.safetensors"))["heldout"]
    s = config.seq_len
    return token_sets_from_stream(
        held,
        {"eval": (*TINY_EVAL, s), "curvature": (*TINY_CURVATURE, s)},
        seed=seed,
        meta={"source": "embedded[heldout]"},
    )


def tiny_monitor(
    config, store: str | Path, out_dir: str | Path, data_dir: str | Path | None = None, every: int = 50, **settings
) -> RobustnessMonitor:
    """A monitor for a tiny run of ``config`` trained into ``out_dir`` (data cache ``data_dir``,
    default ``out_dir/data``) writing to ``store`` (run name = the run's name), measuring every
    ``every`` steps; ``settings`` override :class:`~losslens.study.monitor.MonitorSettings`."""
    sets = tiny_monitor_sets(config, out_dir, data_dir if data_dir is not None else Path(out_dir) / "data")
    return RobustnessMonitor(
        store,
        sets["eval"],
        sets["curvature"],
        run=config.run_name,
        every=every,
        tokens_per_step=config.tokens_per_step,
        **settings,
    )


@settings
@dataclass(frozen=True)
class WatchSettings:
    """Whether ``losslens train-tiny`` monitors its run (``monitor``: ΔQ, loss, trace and λ_max into
    OUT/monitor.sqlite; one run only) and every how many updates (``monitor_every``)."""

    monitor: bool = False
    monitor_every: int = 50


@dataclass(frozen=True)
class WatchedRuns:
    """:func:`train_tiny_watched`'s result: the :class:`TrainRuns`, and with the monitor its store and
    :meth:`RobustnessMonitor.summary` (None without)."""

    runs: TrainRuns
    store: Optional[Path] = None
    summary: Optional[dict] = None


def train_tiny_watched(
    out: str | Path,
    settings: TrainSettings = TrainSettings(),
    watch: WatchSettings = WatchSettings(),
    *,
    on_run: Callable[[dict], None] | None = None,
) -> WatchedRuns:
    """``losslens train-tiny``: :func:`train_runs` into ``out`` (``on_run``: each sweep run's index entry),
    with the monitor of ``watch`` on a single run (:func:`tiny_monitor`, store OUT/monitor.sqlite; closed
    however the run ends). Raises :class:`TrainError` saying what to change (``--monitor`` with a sweep,
    and :func:`train_runs`' errors) before anything is trained."""
    if watch.monitor and settings.is_sweep:
        raise TrainError("--monitor watches one run; it cannot be combined with --sweep / --seeds")
    if not watch.monitor:
        return WatchedRuns(train_runs(out, settings, on_run=on_run))
    store = Path(out) / "monitor.sqlite"
    mon = tiny_monitor(settings.config(), store, out, settings.data_dir, every=watch.monitor_every)
    try:
        runs = train_runs(out, settings, on_run=on_run, on_step=mon.step)
        return WatchedRuns(runs, store, mon.summary())
    finally:
        mon.close()

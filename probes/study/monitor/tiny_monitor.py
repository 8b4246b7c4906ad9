"""The monitor for the embedded tiny trajectories (``losslens train-tiny --monitor``, the demo):
its held-out token sets and a :class:`~losslens.study.monitor.RobustnessMonitor` for one
:class:`~losslens.lm.train.config.TrainConfig`."""

from __future__ import annotations

from pathlib import Path

from losslens.lm.data import token_sets_from_stream

from losslens.study.monitor.monitor import RobustnessMonitor

__all__ = ["tiny_monitor_sets", "tiny_monitor", "TINY_EVAL", "TINY_CURVATURE"]

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

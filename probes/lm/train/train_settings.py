"""What ``losslens train-tiny`` trains, as one settings object, and the call that trains it.

:class:`TrainSettings` holds the :class:`~losslens.lm.train.config.TrainConfig` fields that override the
default run (or the tiny preset's, with ``tiny``) and how the runs are made: a sweep (``sweep`` /
``seeds``) or one run (resumable from ``resume_from``), the shared token cache, torch's threads,
``force`` and ``quiet``. :func:`train_runs` checks them and trains one run or the sweep; the monitor
(``--monitor``) is wired by :func:`losslens.study.monitor.tiny_monitor.train_tiny_watched`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from losslens.lm.shared_settings import settings
from losslens.lm.train.config import TrainConfig, TrainError
from losslens.lm.train.grid import parse_sweep, train_sweep
from losslens.lm.train.tiny import train_tiny


def parse_seeds(text: str | None) -> list[int] | None:
    """ "0,1,2" -> [0, 1, 2]; None -> None; :class:`TrainError` naming ``--seeds`` otherwise."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise TrainError(f"--seeds must be comma-separated integers, got {text!r}") from None


@settings
@dataclass(frozen=True)
class TrainSettings:
    """The run(s) ``losslens train-tiny`` trains: each field from ``schedule`` to ``data_seed`` (and
    ``save_optimizer``, ``name``) a :class:`TrainConfig` field overriding the default config (None: keep it;
    ``tiny``: start from :meth:`TrainConfig.tiny`); ``resume_from`` (one run only), the token cache
    ``data_dir`` (None: OUT/data), torch ``threads``, a ``sweep`` (``KEY=V1,V2,...`` strings) and ``seeds``
    (``"0,1"``), ``force`` (overwrite a different run) and ``quiet`` (no progress lines)."""

    schedule: Optional[str] = None
    peak_lr: Optional[float] = None
    steps: Optional[int] = None
    checkpoints: Optional[int] = None
    seed: Optional[int] = None
    tiny: bool = False
    weight_decay: Optional[float] = None
    warmup: Optional[float] = None
    decay: Optional[float] = None
    min_lr_ratio: Optional[float] = None
    batch_size: Optional[int] = None
    seq_len: Optional[int] = None
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    vocab_size: Optional[int] = None
    grad_clip: Optional[float] = None
    val_batches: Optional[int] = None
    data_seed: Optional[int] = None
    save_optimizer: bool = False
    resume_from: Optional[Path] = None
    name: Optional[str] = None
    data_dir: Optional[Path] = None
    threads: Optional[int] = None
    sweep: Optional[list[str]] = None
    seeds: Optional[str] = None
    force: bool = False
    quiet: bool = False

    @property
    def is_sweep(self) -> bool:
        """Whether these settings ask for a sweep (``sweep`` or ``seeds`` given) rather than one run."""
        return bool(self.sweep) or self.seeds is not None

    def config(self) -> TrainConfig:
        """The (base) config: the default or tiny preset with the given fields; :class:`TrainError` when invalid."""
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in names}
        overrides = {k: v for k, v in given.items() if v is not None and (k != "save_optimizer" or v)}
        return dataclasses.replace(TrainConfig.tiny() if self.tiny else TrainConfig(), **overrides)


@dataclass(frozen=True)
class TrainRuns:
    """What :func:`train_runs` trained: the finished ``trajectories`` (plan order), and for a sweep the
    index entries of ``sweep.json`` (``runs``: name, status, error, final_val_loss, ...; None for one run)."""

    out: Path
    trajectories: list
    runs: Optional[list[dict]] = None

    @property
    def failed(self) -> list[dict]:
        """The sweep's failed runs (none for one run)."""
        return [r for r in self.runs or [] if r["status"] == "failed"]


def train_runs(
    out: str | Path,
    settings: TrainSettings = TrainSettings(),
    *,
    on_run: Callable[[dict], None] | None = None,
    on_step: Callable | None = None,
) -> TrainRuns:
    """Train what ``settings`` ask for into ``out``: a sweep (:func:`~losslens.lm.train.grid.train_sweep`,
    ``on_run`` sees each run's index entry) or one run (:func:`~losslens.lm.train.tiny.train_tiny`,
    ``on_step`` is its per-update hook). Raises :class:`TrainError` with what to change for contradicting
    settings (``resume_from`` with a sweep), a bad sweep or seed list, an invalid config or a folder
    holding a different run."""
    s = settings
    if s.is_sweep:
        if s.resume_from is not None:
            raise TrainError("--resume-from cannot be combined with --sweep / --seeds")
        grid = parse_sweep(s.sweep or [])
        trajs = train_sweep(
            s.config(),
            grid,
            out,
            seeds=parse_seeds(s.seeds),
            progress=not s.quiet,
            overwrite=s.force,
            data_dir=s.data_dir,
            num_threads=s.threads,
            on_run=on_run,
        )
        runs = json.loads((Path(out) / "sweep.json").read_text())["runs"]
        return TrainRuns(Path(out), trajs, runs)
    traj = train_tiny(
        s.config(),
        out,
        progress=not s.quiet,
        resume_from=s.resume_from,
        overwrite=s.force,
        data_dir=s.data_dir,
        num_threads=s.threads,
        on_step=on_step,
    )
    return TrainRuns(Path(out), [traj])


__all__ = ["TrainRuns", "TrainSettings", "parse_seeds", "train_runs"]

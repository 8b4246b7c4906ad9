"""What ``losslens fork`` and ``losslens compare-forks`` do, as settings objects, and the calls that do it.

:class:`ForkSettings` and :func:`fork_runs`: continue a checkpoint of a train-tiny trajectory
(:func:`~losslens.lm.train.forks.fork_trajectory`) or a pretrained checkpoint
(:func:`~losslens.lm.train.checkpoint_forks.fork_pretrained`) under new LR schedules, once per seed;
the settings that apply to one kind of parent only are refused for the other. :class:`CompareSettings`
and :func:`compare_fork_runs`: the forks' quantization gaps and wins per seed pair
(:func:`~losslens.lm.train.fork_compare.compare_forks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from losslens.lm.checkpoints import Trajectory
from losslens.lm.shared_settings import settings
from losslens.lm.train.checkpoint_forks import fork_pretrained
from losslens.lm.train.config import TrainConfig, TrainError
from losslens.lm.train.fork_compare import compare_forks
from losslens.lm.train.fork_schedule import ForkSchedule
from losslens.lm.train.forks import fork_trajectory, parent_checkpoint
from losslens.lm.train.train_settings import parse_seeds

PRETRAINED_LR = 1e-4
"""A pretrained base's LR at the fork when ``start_lr`` is not given."""
PRETRAINED_CHECKPOINTS = 5
"""A pretrained base's fork checkpoints when ``checkpoints`` is not given."""


def is_pretrained_base(parent: str) -> bool:
    """Whether ``losslens fork``'s argument is a pretrained checkpoint (an ``hf:`` name, a ``.gguf`` file,
    or a folder with its own ``config.json``) rather than a train-tiny trajectory folder."""
    p = Path(parent).expanduser()
    return parent.startswith("hf:") or p.suffix.lower() == ".gguf" or (p / "config.json").is_file()


@settings
@dataclass(frozen=True)
class ForkSettings:
    """How ``losslens fork`` continues a parent: the checkpoint (``at``: a label, a step or ``"last"``;
    train-tiny parents only), the schedule (``schedule``: one kind, or for a pretrained base several,
    comma-separated; ``steps``: None, the parent's remaining updates; its LRs and phases as in
    :class:`ForkSchedule`), the data-order ``seeds`` (``"0,1"``), the checkpoints (``checkpoints`` or
    ``every``), AdamW state (``save_optimizer``, ``restart_moments``), the data (train-tiny: ``data_dir``;
    pretrained: ``text``, ``seq_len``, ``batch_size``, hub ``cache_dir``), torch ``threads``, ``force``
    and ``quiet``."""

    at: Optional[str] = None
    schedule: str = "cosine"
    steps: Optional[int] = None
    seeds: str = "0"
    start_lr: Optional[float] = None
    min_lr: Optional[float] = None
    cooldown_at: Optional[int] = None
    period: Optional[int] = None
    restart_lr: Optional[float] = None
    period_mult: float = 1.0
    amplitude: Optional[float] = None
    bump_steps: int = 25
    cool_steps: int = 100
    checkpoints: Optional[int] = None
    every: Optional[int] = None
    save_optimizer: bool = False
    restart_moments: bool = False
    data_dir: Optional[Path] = None
    text: Optional[Path] = None
    seq_len: int = 128
    cache_dir: Optional[Path] = None
    batch_size: int = 8
    threads: Optional[int] = None
    force: bool = False
    quiet: bool = False

    def shape(self) -> dict:
        """The :class:`ForkSchedule` fields given here besides ``kind``, ``steps`` and ``start_lr``."""
        return dict(min_lr=self.min_lr, period=self.period, restart_lr=self.restart_lr, period_mult=self.period_mult,
                    amplitude=self.amplitude, bump_steps=self.bump_steps, cool_steps=self.cool_steps,
                    cooldown_at=self.cooldown_at)  # fmt: skip


@dataclass(frozen=True)
class ForkRuns:
    """What :func:`fork_runs` wrote: the forks (one trajectory per seed and schedule) and whether the
    parent was a pretrained base."""

    trajectories: list
    pretrained: bool


def fork_runs(parent: str, out: str | Path, settings: ForkSettings = ForkSettings()) -> ForkRuns:
    """``losslens fork``: the forks of ``parent`` into ``out`` (+ ``forks.json``). Raises :class:`TrainError`
    saying what to change (an option for the other kind of parent, no ``steps`` for a pretrained base, no
    ``at`` or several schedules for a train-tiny parent, a bad schedule or seed list, a folder holding
    other runs) and ``CheckpointError`` for a parent that cannot be read."""
    s = settings
    if is_pretrained_base(parent):
        return ForkRuns(_fork_pretrained(parent, out, s), pretrained=True)
    if s.at is None:
        raise TrainError("--at is needed for a train-tiny parent (a label, a step number or 'last')")
    if "," in s.schedule:
        raise TrainError("a train-tiny parent forks into one --schedule per call")
    ptraj = Trajectory.from_folder(parent)
    steps = s.steps
    if steps is None:
        if "config" not in ptraj.meta:
            raise TrainError(f"{parent} is not a train-tiny trajectory")
        left = TrainConfig.from_dict(ptraj.meta["config"]).steps - int(parent_checkpoint(ptraj, s.at).step)
        if left < 1:
            raise TrainError(f"{s.at} is the parent's last step; pass --steps N for the fork length")
        steps = left
    sched = ForkSchedule(kind=s.schedule, steps=steps, start_lr=s.start_lr, **s.shape())
    trajs = fork_trajectory(
        ptraj,
        s.at,
        sched,
        out,
        seeds=parse_seeds(s.seeds),
        checkpoints=s.checkpoints,
        every=s.every,
        save_optimizer=s.save_optimizer,
        restart_moments=s.restart_moments,
        progress=not s.quiet,
        overwrite=s.force,
        data_dir=s.data_dir,
        num_threads=s.threads,
    )
    return ForkRuns(trajs, pretrained=False)


def _fork_pretrained(base: str, out: str | Path, s: ForkSettings) -> list:
    """The forks of a pretrained base: its settings checked, one :func:`fork_pretrained` call per seed."""
    tiny_only = {"--at": s.at, "--every": s.every, "--save-optimizer": s.save_optimizer or None,
                 "--restart-moments": s.restart_moments or None, "--data-dir": s.data_dir}  # fmt: skip
    given = [k for k, v in tiny_only.items() if v is not None]
    if given:
        raise TrainError(f"{', '.join(given)} apply to a train-tiny parent only; {base} is a pretrained checkpoint")
    if s.steps is None:
        raise TrainError("a pretrained checkpoint has no remaining steps: pass --steps N")
    scheds = [ForkSchedule(kind=k.strip(), steps=s.steps, **s.shape()) for k in s.schedule.split(",") if k.strip()]
    trajs = []
    for seed in parse_seeds(s.seeds) or [0]:
        trajs += fork_pretrained(
            base, scheds, out, lr=PRETRAINED_LR if s.start_lr is None else s.start_lr, text=s.text,
            seq_len=s.seq_len, batch_size=s.batch_size,
            checkpoints=PRETRAINED_CHECKPOINTS if s.checkpoints is None else s.checkpoints, seed=seed,
            progress=not s.quiet, overwrite=s.force, num_threads=s.threads, cache_dir=s.cache_dir,
        )  # fmt: skip
    return trajs


@settings
@dataclass(frozen=True)
class CompareSettings:
    """How ``losslens compare-forks`` compares: the quantizer ``spec``, every checkpoint or the cool phases
    only (``all_phases``), the ``pairing`` (``seed`` or ``all``) and what is compared (``by``: ``final`` or
    ``mean`` gap), a small evaluation set (``quick``), a ``csv`` file for the per-checkpoint table, torch
    ``threads`` and ``quiet``."""

    spec: str = "rtn:3:row"
    all_phases: bool = False
    pairing: str = "seed"
    by: str = "final"
    quick: bool = False
    csv: Optional[Path] = None
    threads: Optional[int] = None
    quiet: bool = False


def compare_fork_runs(dirs: Iterable[str | Path], settings: CompareSettings = CompareSettings()):
    """``losslens compare-forks``: :func:`compare_forks` of the forks in ``dirs`` (its DataFrame, with
    ``attrs`` ``wins`` and ``summary``), also written to ``settings.csv`` when given. Raises
    :class:`TrainError`, ``CheckpointError`` or ``ValueError`` naming what cannot be compared."""
    s = settings
    df = compare_forks(
        dirs,
        spec=s.spec,
        cool_only=not s.all_phases,
        quick=s.quick,
        pairing=s.pairing,
        by=s.by,
        progress=not s.quiet,
        num_threads=s.threads,
    )
    if s.csv is not None:
        df.to_csv(s.csv, index=False)
    return df


__all__ = [
    "PRETRAINED_CHECKPOINTS",
    "PRETRAINED_LR",
    "CompareSettings",
    "ForkRuns",
    "ForkSettings",
    "compare_fork_runs",
    "fork_runs",
    "is_pretrained_base",
]

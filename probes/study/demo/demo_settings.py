"""The demo's settings: how ``losslens demo`` runs (:class:`DemoOptions`, its options), the embedded
trajectories (:class:`DemoRun`), everything the demo does (:class:`DemoSettings`, recorded in
``DIR/demo.json``), and the two studies it runs: :data:`DEFAULT` and :data:`QUICK` (``--quick``). The demo
itself is :mod:`losslens.study.demo.demo_study`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.lm.shared_settings import settings
from losslens.study.sweep.options import EXECUTORS


class DemoError(LosslensError, ValueError):
    """Demo options the demo cannot use; the message names the option and the valid values."""


@settings
@dataclass(frozen=True)
class DemoOptions:
    """How ``losslens demo`` runs: into ``out`` (resumable), the toy-size study (``quick``: :data:`QUICK`,
    else :data:`DEFAULT`), the sweeps' ``executor`` (one of ``EXECUTORS``), no progress (``quiet``), torch
    ``threads`` per process (None: torch's) and ``workers`` (None: ``$LOSSLENS_WORKERS``, else the cores)."""

    out: Path = Path("demo-out")
    quick: bool = False
    executor: str = "local"
    quiet: bool = False
    threads: Optional[int] = 1
    workers: Optional[int] = None

    def check(self) -> None:
        """:class:`DemoError` for an unknown executor (before minutes of training, not after)."""
        if self.executor not in EXECUTORS:
            raise DemoError(f"unknown executor {self.executor!r}; valid: {', '.join(EXECUTORS)}")


@dataclass(frozen=True)
class DemoRun:
    """One embedded trajectory: schedule (``"wsd"``, ``"cosine"``, ...) and peak LR."""

    schedule: str
    peak_lr: float

    @property
    def name(self) -> str:
        return f"{self.schedule}-lr{self.peak_lr:g}"


@dataclass(frozen=True)
class DemoSettings:
    """Everything the demo does, in one place (recorded in ``DIR/demo.json``)."""

    runs: tuple[DemoRun, ...]
    steps: int
    checkpoints: int
    hidden_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    vocab_size: int
    weight_decay: float
    lawa_k: int
    quant: tuple[str, ...]
    headline_spec: str
    trace_hvps: int
    eigen_iters: int
    eval_shape: tuple[int, int, int]
    calibration_shape: tuple[int, int, int]
    curvature_shape: tuple[int, int, int]
    grid: int
    seed: int = 0
    explain: tuple[str, ...] = ()
    explain_hvps: int = 30
    explain_within: bool = False
    accuracy_limit: int = 0
    """Items of the embedded task (seeded subsample) scored per checkpoint for FP and the headline
    quantizer (the accuracy probe, :mod:`losslens.measure.accuracy`); 0: off."""
    monitor_run: str | None = None
    monitor_every: int = 50
    landscape_grid: int = 0
    """Grid points per axis of the runs' landscape (:func:`losslens.study.demo.demo_jobs.draw_landscape`); 0: none."""

    def train_config(self, run: DemoRun):
        from losslens.lm.train.config import TrainConfig

        return TrainConfig(
            schedule=run.schedule,
            peak_lr=run.peak_lr,
            steps=self.steps,
            checkpoints=self.checkpoints,
            seed=self.seed,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            vocab_size=self.vocab_size,
            name=run.name,
        )

    def plan(self, run: DemoRun):
        from losslens.study.sweep import DataSpec, EigenProbe, ExplainProbe, Plan, TraceProbe

        from losslens.study.sweep import AccuracyProbe

        explain = (
            ExplainProbe(self.explain, within=self.explain_within, trace_matvecs=self.explain_hvps)
            if self.explain
            else None
        )
        accuracy = (
            AccuracyProbe(
                tasks=("embedded",), specs=(self.headline_spec,), limit=self.accuracy_limit, n_boot=1000, seed=self.seed
            )
            if self.accuracy_limit and has_lm_eval()
            else None
        )
        return Plan(
            loss=True,
            quant=self.quant,
            trace=TraceProbe("hutch++", self.trace_hvps),
            explain=explain,
            accuracy=accuracy,
            eigen=EigenProbe(k=1, method="lanczos", tol=1e-3, max_iter=self.eigen_iters),
            directional=(self.headline_spec,),
            kurtosis=True,
            lawa=(self.lawa_k,),
            seed=self.seed,
            data=DataSpec(eval=self.eval_shape, calibration=self.calibration_shape, curvature=self.curvature_shape),
            name=run.name,
        )


def has_lm_eval() -> bool:
    """Whether lm-evaluation-harness (the ``eval`` extra) is installed; without it the demo skips the accuracy probe."""
    import importlib.util

    return importlib.util.find_spec("lm_eval") is not None


_RUNS = (DemoRun("wsd", 3e-3), DemoRun("wsd", 1e-2), DemoRun("cosine", 3e-3), DemoRun("cosine", 1e-2))
_QUANT = ("rtn:2:g32", "rtn:3:row", "rtn:4:row", "int8", "gptq:3:row", "gptq:4:row", "mxfp4", "gguf:Q4_K")
_EXPLAIN = ("rtn:2:g32", "rtn:3:row", "gptq:3:row", "awq:3:row", "int8", "mxfp4", "gguf:Q4_K")


def _embedded_default() -> dict:
    """The model/training fields of :class:`~losslens.lm.train.config.TrainConfig`'s defaults (the
    embedded trajectory), so the demo and `losslens train-tiny` never drift apart."""
    from losslens.lm.train.config import TrainConfig

    t = TrainConfig()
    return dict(
        steps=t.steps,
        checkpoints=t.checkpoints,
        hidden_size=t.hidden_size,
        num_layers=t.num_layers,
        num_heads=t.num_heads,
        seq_len=t.seq_len,
        batch_size=t.batch_size,
        vocab_size=t.vocab_size,
        weight_decay=t.weight_decay,
    )


#: Default demo (6.3–9 min on 2 CPU cores in one process; its stages now run on one worker per
#: core, λ_max by Lanczos: ≤ 30 steps, converged on the true residual) on the embedded trajectory
#: settings: weight decay 1.0
#: brings the weight norm to equilibrium within ~1/(lr·wd) ≈ 100–330 steps, so the stable phase is
#: reached inside the budget; INT2 in groups of 32 and per-row INT3 are grids where the error is
#: far above checkpoint-to-checkpoint noise at hidden size 64 (per-row because "g128" is per-row
#: at in-features ≤ 128 anyway). The explain probe (RTN-2/3, GPTQ-3, AWQ-3, INT8; tr H of the
#: quantized matrices with 30 HVPs per checkpoint, shared by the specs) added 14–18 s per run of 9
#: checkpoints on a loaded 2-core machine (the 60-HVP trace probe took 25–35 s there).
DEFAULT = DemoSettings(
    runs=_RUNS,
    **_embedded_default(),
    lawa_k=3,
    quant=_QUANT,
    headline_spec="rtn:2:g32",
    trace_hvps=60,
    eigen_iters=30,
    eval_shape=(8, 16, 64),
    calibration_shape=(4, 16, 64),
    curvature_shape=(1, 16, 64),
    grid=15,
    explain=_EXPLAIN,
    explain_hvps=30,
    accuracy_limit=200,
    monitor_run=_RUNS[0].name,
    monitor_every=100,
    landscape_grid=13,
)

#: ``--quick``: the same study at toy size (≤ 2 min; used by the tests), with the explain probe's
#: within-block parts switched on (one HVP per block and spec: off in the default demo for time).
QUICK = replace(
    DEFAULT,
    runs=(DemoRun("wsd", 3e-3), DemoRun("cosine", 1e-2)),
    steps=120,
    checkpoints=4,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    batch_size=16,
    vocab_size=384,
    quant=("rtn:2:g32", "rtn:3:row", "int8", "gptq:3:row", "mxfp4"),
    trace_hvps=12,
    eigen_iters=20,
    eval_shape=(2, 8, 64),
    calibration_shape=(2, 8, 64),
    curvature_shape=(1, 4, 64),
    grid=5,
    explain_hvps=12,
    explain_within=True,
    accuracy_limit=60,
    monitor_every=30,
    landscape_grid=5,
)

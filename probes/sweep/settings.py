"""The settings of each probe a plan holds (trace, eigen, block traces, explain), their error and
integer check; :mod:`.plan` combines them into a :class:`~probes.sweep.plan.Plan` and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from geometry.base.errors import LosslensError

TRACE_METHODS = ("hutch++", "hutchinson")
EIGEN_METHODS = ("power", "lanczos")


class PlanError(LosslensError, ValueError):
    """A plan names an unknown probe, option or spec, or has an invalid value."""


def positive_int(name: str, v, minimum: int = 1) -> None:
    """Raise :class:`PlanError` unless ``v`` is an int (not a bool) ≥ ``minimum``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise PlanError(f"{name} must be an integer >= {minimum}, got {v!r}")


@dataclass(frozen=True)
class TraceProbe:
    """Hessian trace by ``method`` ('hutch++' | 'hutchinson') with a budget of ``num_matvecs`` HVPs."""

    method: str = "hutch++"
    num_matvecs: int = 100

    def __post_init__(self):
        if self.method not in TRACE_METHODS:
            raise PlanError(f"trace method {self.method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
        positive_int("trace.num_matvecs", self.num_matvecs, minimum=3 if self.method == "hutch++" else 1)


@dataclass(frozen=True)
class EigenProbe:
    """Top-``k`` Hessian eigenvalues (by magnitude, sign kept) by Lanczos (default) or power iteration;
    converged means a true residual ‖Hv − λv‖ ≤ tol·``|λ|`` (:func:`geometry.estimators.eigen.top_eigenvalues`)."""

    k: int = 1
    method: str = "lanczos"
    tol: float = 1e-3
    max_iter: int = 100

    def __post_init__(self):
        if self.method not in EIGEN_METHODS:
            raise PlanError(f"eigen method {self.method!r} is unknown; valid: {', '.join(EIGEN_METHODS)}")
        positive_int("eigen.k", self.k)
        positive_int("eigen.max_iter", self.max_iter)
        if not (isinstance(self.tol, (int, float)) and self.tol > 0):
            raise PlanError(f"eigen.tol must be a positive number, got {self.tol!r}")


@dataclass(frozen=True)
class BlockTraceProbe:
    """Per-group Hessian traces. ``groups``: 'module' | 'parameter' | 'block' (one group per decoder
    block plus 'other') or a mapping ``{group: glob | [globs]}`` (as :meth:`ParamSpace.groups`)."""

    groups: Any = "block"
    num_matvecs: int = 50

    def __post_init__(self):
        g = self.groups
        if isinstance(g, str):
            if g not in ("module", "parameter", "block"):
                raise PlanError(
                    f"block_trace.groups {g!r} is unknown; valid: 'block', 'module', 'parameter' or a mapping of globs"
                )
        elif isinstance(g, Mapping):
            if not g:
                raise PlanError("block_trace.groups mapping is empty")
            norm = {}
            for k, v in g.items():
                globs = (v,) if isinstance(v, str) else tuple(v)
                if not globs or not all(isinstance(x, str) for x in globs):
                    raise PlanError(f"block_trace.groups[{k!r}] must be a glob or a list of globs, got {v!r}")
                norm[str(k)] = globs
            object.__setattr__(self, "groups", tuple(sorted(norm.items())))
        elif isinstance(g, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in g):
            pass  # already normalised
        else:
            raise PlanError(f"block_trace.groups must be 'block', 'module', 'parameter' or a mapping, got {g!r}")
        positive_int("block_trace.num_matvecs", self.num_matvecs)

    def groups_arg(self):
        """The groups in the form :meth:`ParamSpace.groups` takes ('block' is resolved by the runner)."""
        return self.groups if isinstance(self.groups, str) else {k: list(v) for k, v in self.groups}


@dataclass(frozen=True)
class ExplainProbe:
    """Second-order attribution of each quantizer's loss change (:mod:`probes.explain`).

    Per checkpoint and spec: ΔL = L(θ̂) − L(θ) on the curvature set, gᵀδ, ½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ
    with tr H's interval carried into κ, the remainder, and δᵀHδ, gᵀδ, ‖δ‖² per block of every
    partition in ``blocks`` ('layer', 'kind', 'layer_kind', 'module', 'parameter'). ``within``: also
    δ_bᵀH_bbδ_b per block (one more HVP per block and spec). tr H is of the quantized matrices (the
    space of δ), estimated once per checkpoint with ``trace_method`` and ``trace_matvecs`` HVPs and
    shared by the specs (reused from the ``trace`` probe when that ran on the same space with the
    same method, budget and seed). Cost per spec: the quantizer, one gradient, one HVP (shared with
    a ``directional`` probe of the same spec), one forward pass of θ̂.
    """

    specs: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ("layer", "kind")
    within: bool = False
    trace_matvecs: int = 30
    trace_method: str = "hutch++"

    def __post_init__(self):
        from probes.explain.blocks import PARTITIONS
        from probes.explain.measure import TRACE_METHODS

        specs = (self.specs,) if isinstance(self.specs, str) else tuple(self.specs)
        if not specs or not all(isinstance(s, str) and s.strip() for s in specs):
            raise PlanError(
                f"explain.specs must be a non-empty list of quantizer specs like 'rtn:4:g128', got {self.specs!r}"
            )
        blocks = (self.blocks,) if isinstance(self.blocks, str) else tuple(self.blocks)
        bad = [b for b in blocks if b not in PARTITIONS]
        if bad:
            raise PlanError(f"explain.blocks {bad} unknown; valid: {', '.join(PARTITIONS)}")
        if self.trace_method not in TRACE_METHODS:
            raise PlanError(f"explain.trace_method {self.trace_method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
        if not isinstance(self.within, bool):
            raise PlanError(f"explain.within must be true or false, got {self.within!r}")
        positive_int("explain.trace_matvecs", self.trace_matvecs, minimum=3 if self.trace_method == "hutch++" else 1)
        object.__setattr__(self, "specs", specs)
        object.__setattr__(self, "blocks", tuple(dict.fromkeys(blocks)))


@dataclass(frozen=True)
class AccuracyProbe:
    """Task accuracy through lm-evaluation-harness (:mod:`probes.accuracy`) of the FP checkpoint and
    of its quantized copies under ``specs``: ``tasks`` (lm-eval names, task YAML paths or folders,
    ``embedded``, ``seed-12``), ``limit`` (a seeded random subsample of that many items per task;
    None: all), ``num_fewshot`` (None: the preset's or task's own), ``seed`` (subsample and
    bootstrap), ``n_boot`` (paired bootstrap resamples for Δacc), ``batch_size`` (sequences per
    forward; not part of the settings hash). Rows: ``fp``, ``fp@TASK``, ``SPEC``, ``SPEC@TASK``
    (:mod:`probes.accuracy.rows`)."""

    tasks: tuple[str, ...] = ("embedded",)
    specs: tuple[str, ...] = ()
    limit: int | None = None
    num_fewshot: int | None = None
    seed: int = 0
    n_boot: int = 2000
    batch_size: int = 32

    def __post_init__(self):
        tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
        if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
            raise PlanError(f"accuracy.tasks must be a non-empty list of task names / paths, got {self.tasks!r}")
        specs = (self.specs,) if isinstance(self.specs, str) else tuple(self.specs)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "specs", specs)
        if self.limit is not None:
            positive_int("accuracy.limit", self.limit)
        if self.num_fewshot is not None:
            positive_int("accuracy.num_fewshot", self.num_fewshot, minimum=0)
        positive_int("accuracy.n_boot", self.n_boot, minimum=0)
        positive_int("accuracy.batch_size", self.batch_size)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise PlanError(f"accuracy.seed must be an integer, got {self.seed!r}")

    def task_names(self) -> tuple[str, ...]:
        """The task names the rows are keyed by (presets and folders expanded)."""
        from probes.accuracy.selection import AccuracyError, select_tasks

        try:
            return select_tasks(list(self.tasks)).names
        except AccuracyError as exc:
            raise PlanError(f"accuracy.tasks: {exc}") from exc


__all__ = [
    "PlanError",
    "AccuracyProbe",
    "TraceProbe",
    "EigenProbe",
    "BlockTraceProbe",
    "ExplainProbe",
    "positive_int",
    "TRACE_METHODS",
    "EIGEN_METHODS",
]

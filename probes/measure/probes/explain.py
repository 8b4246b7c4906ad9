"""The ``explain`` probe: why each quantizer changes the loss, by factor and by block (:mod:`losslens.measure.explain`).

Plan: ``explain = { specs = ["rtn:4"], blocks = ["layer", "kind"], trace_matvecs = 30 }``
(:class:`ExplainProbe`; a list of specs is short for ``specs``). One row per spec, on the curvature
set in δ-space (the quantized matrices): metrics ``actual_delta``, ``rel_delta``, ``gTd``,
``quadratic`` = dHd/2, ``pred_delta``, ``remainder``, ``norm2``, ``trace`` (CI), ``trace_per_param``
(CI), ``rayleigh``, ``kappa`` (CI), ``loss``, ``q_loss``; per block ``dHd[part:block]``,
``gTd[...]``, ``norm2[...]``, ``within[...]``. δ is shared with a ``directional`` row of the same
spec; tr H of the quantized matrices is estimated once per checkpoint and shared by the specs (taken
from the ``trace`` probe when that ran on the same parameters with the same method, budget and seed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Mapping

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, metric
from losslens.measure.probes.tasks import curvature_options, make_task, quant_options
from losslens.measure.probes.validation import PlanError, canonical_spec, positive_int, settings_from_table


@dataclass(frozen=True)
class ExplainProbe:
    """Second-order attribution of each quantizer's loss change (:mod:`losslens.measure.explain`).

    Per checkpoint and spec: ΔL = L(θ̂) − L(θ) on the curvature set, gᵀδ,
    ½δᵀHδ = ½·‖δ‖²·(tr H/n)·κ with tr H's interval carried into κ, the remainder, and δᵀHδ, gᵀδ, ‖δ‖² per block of every
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
        from losslens.measure.explain.blocks import PARTITIONS
        from losslens.measure.explain.direction import TRACE_METHODS

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


def settings(e) -> ExplainProbe | None:
    if isinstance(e, (str, list, tuple)) or isinstance(e, Mapping):
        e = ExplainProbe(specs=e) if not isinstance(e, Mapping) else settings_from_table(ExplainProbe, e, "explain")
    if e is not None and not isinstance(e, ExplainProbe):
        raise PlanError(f"explain must be an ExplainProbe, a list of quantizer specs or a table, got {e!r}")
    return e if e is None else replace(e, specs=tuple(canonical_spec(s, "explain") for s in e.specs))


def to_dict(e: ExplainProbe | None):
    return None if e is None else {**asdict(e), "specs": list(e.specs), "blocks": list(e.blocks)}


def tasks(plan) -> list:
    e = plan.explain
    if e is None:
        return []
    opts = {**quant_options(plan), **curvature_options(plan), **asdict(e), "specs": None, "seed": plan.seed}
    return [make_task("explain", s, opts, curvature=True) for s in e.specs]


def run(st, task) -> ProbeRow:
    from losslens.measure.explain.explanation import product_warning, row_metrics, worst_check
    from losslens.measure.explain.direction import checked_direction_trace

    o = task.opts
    fresh = not st.has_direction(task.spec)
    m = st.direction(task.spec)
    key = (m.names, o["trace_method"], o["trace_matvecs"], o["seed"])
    trace, spent, trace_check = st.traces.get(key), 0, None
    if trace is None:  # with the plan's backend and compute dtype, as the direction's products
        trace, trace_check = checked_direction_trace(
            st.model,
            m.names,
            list(st.data("curvature")),
            o["trace_matvecs"],
            o["trace_method"],
            o["seed"],
            st.plan.max_memory,
            st.plan.backend,
            st.plan.compute_dtype,
        )
        st.traces[key], spent = trace, int(trace.num_matvecs)
    warning = product_warning(worst_check([m.hvp_check, trace_check]))  # a reused trace was flagged where made
    ms = [metric(*t) for t in row_metrics(m, trace, st.model, o["blocks"])]
    return ProbeRow(
        st.label,
        "explain",
        task.spec,
        metrics=ms,
        extra={
            "dim": m.parts.dim,
            "trace_method": trace.method,
            "trace_hvps": int(trace.num_matvecs),
            "trace_estimated_here": bool(spent),
            "direction_shared": not fresh,
            "layer_errors": dict(m.layer_errors),
            "within_hvps": m.within_matvecs,
            "memory": trace.memory,
            **({"error_warning": warning} if warning else {}),
        },
        n_hvp=spent + m.within_matvecs + (int(m.parts.num_matvecs) if fresh else 0),
        seed=o["seed"],
    )


PROBE = Probe("explain", "ExplainProbe | None", None, settings, tasks, run, to_dict=to_dict, metric="kappa")

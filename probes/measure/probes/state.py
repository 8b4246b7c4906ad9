"""One loaded checkpoint and what its probes share: :class:`CheckpointState`.

Per checkpoint: the FP loss on the eval set is computed once (by the ``loss`` probe or the first
``quant`` probe) and reused as ``fp_loss`` for every quantizer spec; one
:class:`losslens.geometry.operators.hessian.HessianOperator` of :func:`losslens.lm.core.next_token_loss.lm_loss` on the
curvature set, w.r.t. ``plan.curvature_params``, serves trace, eigen and block_trace; a
``directional`` and an ``explain`` row of the same spec share one measurement of δ
(:meth:`CheckpointState.direction`); traces are kept for probes that can reuse them; ``cache``
holds what one probe shares between its own rows (e.g. accuracy's FP scores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from losslens.geometry.base.errors import LosslensError

if TYPE_CHECKING:  # torch is imported lazily so that `losslens --help` stays fast
    import torch


class ProbeError(LosslensError, RuntimeError):
    """A probe could not run (missing data set, unsupported option)."""


class CheckpointState:
    """One loaded checkpoint and what its probes share (FP loss, the Hessian operator, directions).

    ``plan``: the sweep's :class:`losslens.study.sweep.plan.Plan`; ``token_sets``: ``{name: TokenSet}``;
    ``parallel``: a :class:`losslens.geometry.operators.data_parallel.DataParallel` when the curvature batches are
    split over data-parallel ranks. ``label`` and ``ref`` are set by the driver; so is ``on_products``,
    told of every ``n`` Hessian-vector products of the shared operator (a progress display's, or None).
    """

    def __init__(self, model: torch.nn.Module, plan, token_sets: Mapping[str, Any], parallel=None):
        self.model = model
        self.parallel = parallel
        self.plan = plan
        self.token_sets = token_sets
        self.label = ""
        self.ref = None
        self.on_products = None
        self._fp = None
        self._op = None
        self._directions: dict[str, Any] = {}
        self.cache: dict[Any, Any] = {}
        self.traces: dict[tuple, Any] = {}  # (parameter names, method, HVPs, seed) -> TraceEstimate

    def data(self, name: str):
        ts = self.token_sets.get(name)
        if ts is None:
            raise ProbeError(f"the plan needs the {name!r} token set; it was not built/passed")
        return ts

    def fp_loss(self):
        """:class:`losslens.lm.core.next_token_loss.LossResult` of the FP model on the eval set (computed once)."""
        if self._fp is None:
            from losslens.lm.core.next_token_loss import evaluate

            self._fp = evaluate(self.model, self.data("eval"))
        return self._fp

    def hessian(self):
        """The shared :class:`HessianOperator` on the curvature set (built once)."""
        if self._op is None:
            from losslens.lm.models.curvature import lm_hessian

            batches, extra = list(self.data("curvature")), {}
            if self.parallel is not None:  # this rank's share; products all-reduced over the ranks
                from losslens.geometry.operators.data_parallel import split_batches

                batches = split_batches(batches, self.parallel.rank, self.parallel.world_size)
                extra = {"data_parallel": self.parallel}
            self._op = lm_hessian(
                self.model,
                batches,
                params=self.plan.curvature_params,
                max_memory=self.plan.max_memory,
                backend=self.plan.backend,
                compute_dtype=self.plan.compute_dtype,
                **extra,
            )
        self._op.on_products = self.on_products
        return self._op

    def has_direction(self, spec: str) -> bool:
        """Whether δ of quantizer ``spec`` was measured already on this checkpoint."""
        return spec in self._directions

    def direction(self, spec: str):
        """The :class:`losslens.measure.explain.DirectionMeasure` of quantizer ``spec`` (numbers only, measured
        once per checkpoint; with the within-block parts the plan's explain probe asks for)."""
        if spec not in self._directions:
            from losslens.measure.explain import measure_direction

            e = self.plan.explain
            within = e.blocks if e is not None and e.within and spec in e.specs else ()
            trace = (e.trace_method, e.trace_matvecs) if e is not None and spec in e.specs else None
            self._directions[spec] = measure_direction(
                self.model,
                spec,
                list(self.data("curvature")),
                self.token_sets.get("calibration"),
                self.plan.quant_modules,
                within,
                max_memory=self.plan.max_memory,
                plan_trace=trace,
                backend=self.plan.backend,
                compute_dtype=self.plan.compute_dtype,
            )
        return self._directions[spec]


__all__ = ["CheckpointState", "ProbeError"]

"""The quantization direction δ = θ̂ − θ of one quantizer, measured once on the curvature set.

:func:`measure_direction` quantizes a copy of the model (:func:`losslens.lm.quant.quantize`), takes δ on
the quantized matrices (the only parameters a weight-only quantizer changes; every other parameter
is checked to be unchanged) and spends one gradient and one HVP of the LM loss on the curvature set
w.r.t. those matrices (:func:`losslens.geometry.estimators.attribution.direction_parts`): per-matrix δᵀg, δᵀHδ, ‖δ‖²,
plus the measured L(θ̂) − L(θ) on the same batches. Optionally the within-block curvatures
δ_bᵀH_bbδ_b for block partitions (one HVP per block). The result holds numbers only (no tensors),
so sweeps cache it per spec and the ``directional`` and ``explain`` probes share it.

The space of δ — the quantized matrices, n = their parameter count — is the space of tr H and κ
(:func:`direction_trace`): κ = 1 is the curvature of a random direction *among the quantized
weights*, the fair reference for a quantizer (embeddings and norms are never moved).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn

from losslens.geometry.operators.names import DEFAULT_BACKEND
from losslens.geometry.base.errors import LosslensError
from losslens.geometry.estimators.attribution import direction_parts, within_block_curvature
from losslens.geometry.estimators.directional import estimate_memory as direction_memory
from losslens.geometry.estimators.trace import estimate_memory as trace_memory
from losslens.geometry.estimators.sampling import plan_probe_blocks
from losslens.geometry.base.params import literal_glob
from losslens.geometry.base.attribution_results import DirectionParts
from losslens.geometry.base.results import TraceEstimate
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.core.modules import select_linears
from losslens.lm.models.curvature import lm_hessian
from losslens.lm.models.zero_embeddings import curvature_loss, zero_embedding_tokens
from losslens.lm.quant import quantize

from losslens.measure.explain.blocks import block_members, glob_groups

TRACE_METHODS = ("hutch++", "hutchinson")


class ExplainError(LosslensError, ValueError):
    """The direction cannot be explained as asked (a quantizer that moves unexpected parameters,
    a zero direction, bad options)."""


@dataclass(frozen=True)
class DirectionMeasure:
    """One quantizer's δ on one checkpoint, as numbers.

    Attributes:
        spec: canonical quantizer spec.
        parts: per quantized matrix δᵀg, δᵀHδ, ‖δ‖² and L(θ) on the curvature set (1 gradient, 1 HVP).
        q_loss: L(θ̂) on the same curvature batches (nats).
        within: ``{partition: {block: δ_bᵀH_bbδ_b}}`` for the partitions asked for.
        within_matvecs: HVPs spent on ``within``.
        layer_errors: ‖Ŵ − W‖/‖W‖ per quantized linear.
        quant_seconds, seconds: quantization time, and the whole measurement's.
        hvp_check: the measured error of the products behind ``parts`` (:func:`product_check`; None
            for an exact backend).
    """

    spec: str
    parts: DirectionParts
    q_loss: float
    within: dict[str, dict[str, float]] = field(default_factory=dict)
    within_matvecs: int = 0
    layer_errors: dict[str, float] = field(default_factory=dict)
    quant_seconds: float = 0.0
    seconds: float = 0.0
    hvp_check: dict | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.parts.names

    @property
    def loss(self) -> float:
        return self.parts.loss

    @property
    def actual(self) -> float:
        """L(θ̂) − L(θ) on the curvature set."""
        return self.q_loss - self.parts.loss


@contextlib.contextmanager
def _grad_enabled(model: nn.Module) -> Iterator[None]:
    """Every parameter requires grad and the model is in eval mode inside; both restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    training = model.training
    try:
        model.requires_grad_(True)
        model.eval()
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        model.train(training)


def direction_operator(model: nn.Module, names: Sequence[str], curvature, **kwargs):
    """The checked LM Hessian on the curvature batches w.r.t. exactly the parameters ``names``."""
    return lm_hessian(model, list(curvature), params=[literal_glob(n) for n in names], **kwargs)


def product_check(op) -> dict | None:
    """``op``'s measured product error (``op.checked()``: rel_error, reference, step, ...) with the
    dtype its products ran in (``compute_dtype``), for :func:`losslens.lm.models.curvature.error_warning`;
    None for an exact backend. Measured once per operator (a few exact and inexact products on a check
    slice); free when the estimators' memory plans measured it already."""
    check = op.checked()
    return None if check is None else {**check, "compute_dtype": str(op.param_dtype).replace("torch.", "")}


def quantized_direction(model: nn.Module, spec, calibration=None, modules=None):
    """``(δ {weight name: θ̂ − θ}, QuantizedModel)`` of ``spec`` on the selected linears. Raises
    :class:`ExplainError` when the quantizer changed a parameter outside the quantized weights."""
    qm = quantize(model, spec, calibration=calibration, modules=modules)
    params = dict(model.named_parameters())
    qparams = dict(qm.model.named_parameters())
    names = [f"{n}.weight" for n in qm.names]
    missing = [n for n in names if n not in params]
    if missing:
        raise ExplainError(f"quantized layers without a '.weight' parameter: {missing[:3]}")
    chosen = set(names)
    moved = [n for n, p in params.items() if n not in chosen and not torch.equal(p.detach(), qparams[n].detach())]
    if moved:
        raise ExplainError(
            f"{qm.spec} changed parameters outside the quantized weights ({moved[:3]}); "
            "δ = θ̂ − θ would not live on the quantized matrices"
        )
    order = {n: i for i, n in enumerate(params)}
    names.sort(key=order.__getitem__)
    return {n: (qparams[n].detach() - params[n].detach()) for n in names}, qm


def plan_curvature(
    model: nn.Module,
    curvature,
    modules=None,
    within: Sequence[str] = (),
    max_memory=None,
    trace: tuple[str, int] | None = None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
) -> dict[str, dict]:
    """Check, before any quantizer runs, that the curvature steps of an explanation fit ``max_memory``.

    The space of δ is known before quantizing: the weights of the linears ``modules`` selects
    (:func:`losslens.lm.core.modules.select_linears`, as :func:`losslens.lm.quant.quantize` does). On the LM
    Hessian of that space this plans δᵀg and δᵀHδ (:func:`losslens.geometry.estimators.directional.estimate_memory`),
    the within-block curvatures of each partition in ``within``, and, when ``trace`` =
    ``(method, num_matvecs)``, tr H. Raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when
    one does not fit. Returns the plans (``MemoryEstimate.to_dict``) by step. Cost: no HVP; the
    operator measures one batch's graph on one row (a forward and backward of one sequence).
    """
    names = [f"{n}.weight" for n in select_linears(model, modules)]
    plans: dict[str, dict] = {}
    with _grad_enabled(model):
        op = direction_operator(
            model, names, curvature, max_memory=max_memory, backend=backend, compute_dtype=compute_dtype
        )
        plans["direction"] = direction_memory(op, max_memory).to_dict()
        for partition in dict.fromkeys(within):
            groups = glob_groups(block_members(model, names, partition))
            plans[f"within {partition}"] = plan_probe_blocks(
                op, len(groups), None, max_memory, "within-block curvature"
            ).to_dict()
        if trace is not None:
            method, matvecs = trace
            if method not in TRACE_METHODS:
                raise ExplainError(f"trace method {method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
            plans["trace"] = trace_memory(op, method, int(matvecs), max_memory).to_dict()
    return plans


def measure_direction(
    model: nn.Module,
    spec,
    curvature,
    calibration=None,
    modules=None,
    within: Sequence[str] = (),
    max_memory=None,
    plan_trace: tuple[str, int] | None = None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
) -> DirectionMeasure:
    """Quantize, then δᵀg, δᵀHδ, ‖δ‖² per quantized matrix and L(θ̂) − L(θ) on ``curvature``.

    Args:
        model: the FP model (not modified). spec: quantizer spec (string or QuantSpec).
        curvature: the curvature token batches ([b, s] LongTensors or a TokenSet).
        calibration: calibration batches (GPTQ / AWQ). modules: linear globs (default: every
            Linear in the decoder blocks).
        within: block partitions (:data:`losslens.measure.explain.blocks.PARTITIONS`) whose within-block
            curvatures δ_bᵀH_bbδ_b to compute (one HVP per block).
        max_memory: estimator memory budget (bytes or ``"8GB"``).
        plan_trace: ``(method, num_matvecs)`` of a tr H estimate that will follow on the same space,
            planned with the rest (:func:`plan_curvature`) before the quantizer runs.
        backend: HVP backend (:func:`losslens.lm.models.curvature.lm_hessian`); ``compute_dtype``: the dtype
            its products run in (None: float32 for half-precision weights).

    Every curvature step's memory is planned (:func:`plan_curvature`) before quantizing: a budget
    that cannot hold them raises :class:`~losslens.geometry.memory.budget.MemoryBudgetError` before GPTQ runs.
    Cost: the quantizer; one gradient + 1 HVP (+ one HVP per within block); one forward pass of
    θ̂ over the curvature set. Memory: δ, g, Hδ (three vectors of the quantized matrices' size),
    one quantized copy of the model.
    """
    t0 = time.perf_counter()
    plan_curvature(model, curvature, modules, within, max_memory, plan_trace, backend, compute_dtype)
    with _grad_enabled(model):
        delta, qm = quantized_direction(model, spec, calibration, modules)
        # on the loss the curvature operator takes (zero-embedding tokens of θ left out,
        # losslens.lm.models.zero_embeddings)
        q_loss = evaluate(qm.model, list(curvature), loss_fn=curvature_loss(lm_loss, zero_embedding_tokens(model))).loss
        canonical, errors, quant_seconds = (
            str(qm.spec),
            {k: float(v) for k, v in qm.layer_errors.items()},
            float(qm.seconds),
        )
        del qm  # the quantized copy goes before the curvature's memory plan
        op = direction_operator(
            model, list(delta), curvature, max_memory=max_memory, backend=backend, compute_dtype=compute_dtype
        )
        parts = direction_parts(op, delta, max_memory=max_memory)
        if parts.total_norm2 == 0:
            raise ExplainError(
                f"{canonical} left every quantized weight unchanged (δ = 0): there is nothing to explain"
            )
        spent = 0
        inner: dict[str, dict[str, float]] = {}
        for partition in dict.fromkeys(within):
            groups = glob_groups(block_members(model, list(delta), partition))
            inner[partition], n = within_block_curvature(op, delta, groups, max_memory)
            spent += n
    return DirectionMeasure(
        spec=canonical,
        parts=parts,
        q_loss=float(q_loss),
        within=inner,
        within_matvecs=spent,
        layer_errors=errors,
        quant_seconds=quant_seconds,
        seconds=time.perf_counter() - t0,
        hvp_check=product_check(op),
    )


def direction_trace(
    model: nn.Module,
    names: Sequence[str],
    curvature,
    num_matvecs: int = 30,
    method: str = "hutch++",
    seed: int = 0,
    max_memory=None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
) -> TraceEstimate:
    """tr H of the LM loss on ``curvature`` w.r.t. the parameters ``names`` (the space of δ):
    Hutch++ or Hutchinson with ``num_matvecs`` HVPs (exact when the budget reaches the dimension)."""
    return checked_direction_trace(
        model, names, curvature, num_matvecs, method, seed, max_memory, backend, compute_dtype
    )[0]


def checked_direction_trace(
    model: nn.Module,
    names: Sequence[str],
    curvature,
    num_matvecs: int = 30,
    method: str = "hutch++",
    seed: int = 0,
    max_memory=None,
    backend: str = DEFAULT_BACKEND,
    compute_dtype: str | None = None,
) -> tuple[TraceEstimate, dict | None]:
    """:func:`direction_trace` and the measured error of its products (:func:`product_check`)."""
    from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace

    if method not in TRACE_METHODS:
        raise ExplainError(f"trace method {method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
    with _grad_enabled(model):
        op = direction_operator(
            model, names, curvature, max_memory=max_memory, backend=backend, compute_dtype=compute_dtype
        )
        fn = hutchpp_trace if method == "hutch++" else hutchinson_trace
        return fn(op, num_matvecs=num_matvecs, seed=seed, max_memory=max_memory), product_check(op)


__all__ = [
    "DirectionMeasure",
    "ExplainError",
    "measure_direction",
    "plan_curvature",
    "direction_trace",
    "checked_direction_trace",
    "direction_operator",
    "product_check",
    "quantized_direction",
    "TRACE_METHODS",
]

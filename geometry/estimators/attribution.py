"""Second-order attribution of a loss change along a direction: by factor and by parameter block.

For a step d (e.g. quantization, d = θ̂ − θ) the second-order model of the loss change is
ΔL ≈ gᵀd + ½ dᵀHd (docs/science.md §4). This module explains it two ways, from the one gradient and the
one HVP that :func:`losslens.geometry.estimators.directional.directional_curvature` spends:

* **by factor** (:func:`factorise`): with n = dim,
  ``½ dᵀHd = ½ · ‖d‖² · (tr H / n) · κ``, ``κ = (dᵀHd / ‖d‖²) / (tr H / n)``.
  κ = 1 is the curvature an isotropic random direction of the same norm sees on average; κ > 1
  means d leans on sharp directions. tr H is a Hutch++ estimate: its 95% interval propagates into
  tr H/n and κ. The remainder ΔL − (gᵀd + ½ dᵀHd) is always part of the result when ΔL is known.
* **by block** (:func:`direction_parts`, :func:`attribute`): for any partition of the parameters
  into blocks b, ``dᵀHd = Σ_b d_bᵀ (Hd)_b`` and ``gᵀd = Σ_b d_bᵀ g_b`` exactly (the same products
  summed in another order). The block's own part ``d_bᵀ H_bb d_b`` (:func:`within_block_curvature`)
  costs one more HVP per block; ``dᵀHd − Σ_b d_bᵀ H_bb d_b`` is what the cross-block terms add.

Memory: the direction, the gradient and Hd (three full-dim vectors, as directional curvature) plus,
for the within-block parts, one block of masked copies of d and their products (``2 · k · dim``
numbers, k chosen to fit ``max_memory``), and the trace estimator's own memory when it runs here.
"""

from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

import torch

from losslens.geometry.estimators._checks import check_int, check_op, flat_direction, refuse_sharded
from losslens.geometry.base._linalg import rowdot
from losslens.geometry.estimators.directional import estimate_memory as _direction_memory
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.params import ParamGlobs
from losslens.geometry.base.attribution_results import Attribution, DirectionParts, QuadraticFactors
from losslens.geometry.base.results import EstimatorError, TraceEstimate
from losslens.geometry.estimators.sampling import plan_probe_blocks
from losslens.geometry.estimators.trace import hutchpp_trace

__all__ = ["factorise", "direction_parts", "group_parts", "within_block_curvature", "attribute", "assemble"]


def _finite(name: str, x: float) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise EstimatorError(f"{name} is not finite ({x}); check the loss, the direction and the operator")
    return x


# ------------------------------------------------------------------------------ by factor
def factorise(
    gTd: float, dHd: float, norm2: float, trace: TraceEstimate | float, dim: int, actual: float | None = None
) -> QuadraticFactors:
    """Split ``½ dᵀHd`` into ``½ · ‖d‖² · (tr H/n) · κ`` with the trace's uncertainty (pure arithmetic).

    Args:
        gTd, dHd, norm2: gᵀd, dᵀHd and ‖d‖² along the direction (exact numbers).
        trace: tr H of the same space as a :class:`TraceEstimate` (its stderr and 95% interval
            propagate) or a float taken as exact.
        dim: n, the number of coordinates of that space (> 0).
        actual: the measured loss change along d on the same data, or None (then ``actual`` and
            ``remainder`` are ``nan``).

    Returns:
        :class:`QuadraticFactors`. κ's interval is ``rayleigh · n / [ci_high, ci_low]`` of the trace
        (unbounded on the side where the trace's interval reaches 0); its stderr is the delta method.

    Raises:
        EstimatorError: d = 0 (nothing to factorise), dim < 1, a non-finite input, or tr H = 0.
    """
    dim = check_int("dim", dim, 1)
    gTd, dHd, norm2 = _finite("gTd", gTd), _finite("dHd", dHd), _finite("norm2", norm2)
    if norm2 <= 0:
        raise EstimatorError(f"‖d‖² = {norm2}: the direction is zero, there is nothing to factorise")
    if isinstance(trace, TraceEstimate):
        t, se, lo, hi, method = trace.value, trace.stderr, trace.ci_low, trace.ci_high, trace.method
    else:
        t = _finite("trace", trace)
        se, lo, hi, method = 0.0, t, t, "given"
    t = _finite("trace", t)
    if t == 0:
        raise EstimatorError("tr H = 0: κ = (dᵀHd/‖d‖²)/(tr H/n) is undefined; check the operator or spend more HVPs")
    rayleigh = dHd / norm2
    kappa = rayleigh * dim / t
    kappa_se = abs(kappa) * se / abs(t) if math.isfinite(se) else math.inf
    if lo > 0 or hi < 0:  # the interval excludes 0: κ is monotone in tr H over it
        ends = sorted((rayleigh * dim / hi, rayleigh * dim / lo))
    else:
        ends = [-math.inf if rayleigh != 0 else 0.0, math.inf if rayleigh != 0 else 0.0]
    actual_f = math.nan if actual is None else _finite("actual", actual)
    predicted = gTd + 0.5 * dHd
    return QuadraticFactors(
        gTd=gTd,
        dHd=dHd,
        quadratic=0.5 * dHd,
        predicted=predicted,
        actual=actual_f,
        remainder=actual_f - predicted,
        norm2=norm2,
        dim=dim,
        trace=t,
        trace_stderr=float(se),
        trace_ci_low=float(lo),
        trace_ci_high=float(hi),
        trace_per_param=t / dim,
        trace_per_param_ci_low=lo / dim,
        trace_per_param_ci_high=hi / dim,
        rayleigh=rayleigh,
        kappa=kappa,
        kappa_stderr=kappa_se,
        kappa_ci_low=ends[0],
        kappa_ci_high=ends[1],
        trace_method=method,
    )


# ------------------------------------------------------------------------------- by block
def direction_parts(
    op: CurvatureOperator, direction: Mapping[str, torch.Tensor] | torch.Tensor, max_memory: int | str | None = None
) -> DirectionParts:
    """Per-parameter ``d_pᵀ g_p``, ``d_pᵀ (Hd)_p`` and ``‖d_p‖²`` from one gradient and one HVP.

    Args:
        op: an operator with ``gradient() -> (loss, flat grad [dim])`` and a parameter space
            (e.g. :class:`~losslens.geometry.operators.hessian.HessianOperator`); one without a space counts as one
            parameter named ``"all"``.
        direction: d as a dict (the keys of ``op.space``) or a flat ``[dim]`` tensor.
        max_memory: as :func:`losslens.geometry.estimators.directional.directional_curvature` (same memory: three
            full-dim vectors plus one operator pass).

    Returns:
        :class:`DirectionParts` (float64 sums per parameter). Cost: one gradient and one HVP.
    """
    check_op(op)
    refuse_sharded(op, "attribution")
    gradient = getattr(op, "gradient", None)
    if not callable(gradient):
        raise EstimatorError(
            f"direction_parts needs an operator with a gradient() method (e.g. HessianOperator); "
            f"{type(op).__name__} has none"
        )
    d = flat_direction(op, direction)
    plan = _direction_memory(op, max_memory)
    t0, n0 = time.perf_counter(), op.num_matvecs
    loss, g = gradient()
    g = g.detach().reshape(-1).to(device=op.device)
    if g.shape[0] != op.dim:
        raise EstimatorError(f"op.gradient() returned a gradient of length {g.shape[0]}, expected {op.dim}")
    Hd = op.matvec_flat(d)
    if op.space is not None:
        names, slices = tuple(op.space.names), list(op.space.slices.values())
    else:
        names, slices = ("all",), [slice(0, op.dim)]
    gTd, dHd, norm2 = [], [], []
    for s in slices:
        ds = d[s][None]
        gTd.append(float(rowdot(g[s][None], ds)[0]))
        dHd.append(float(rowdot(Hd[s][None], ds)[0]))
        norm2.append(float(rowdot(ds, ds)[0]))
    for name, xs in (("gTd", gTd), ("dHd", dHd)):
        _finite(name, math.fsum(xs))
    return DirectionParts(
        names=names,
        numels=tuple(s.stop - s.start for s in slices),
        gTd=tuple(gTd),
        dHd=tuple(dHd),
        norm2=tuple(norm2),
        loss=_finite("loss", loss),
        num_matvecs=op.num_matvecs - n0,
        num_gradients=1,
        seconds=time.perf_counter() - t0,
        memory=plan.to_dict(),
    )


def _check_members(names: tuple[str, ...], members: Mapping[str, Sequence[str]]) -> None:
    seen: dict[str, str] = {}
    for gname, ns in members.items():
        for n in ns:
            if n not in names:
                raise EstimatorError(f"group {gname!r} lists {n!r}, which is not a parameter of the space")
            if n in seen:
                raise EstimatorError(
                    f"parameter {n!r} is in groups {seen[n]!r} and {gname!r}; groups must partition the space"
                )
            seen[n] = gname
    missing = [n for n in names if n not in seen]
    if missing:
        raise EstimatorError(
            f"groups leave out {len(missing)} parameter(s) (e.g. {missing[:3]}); the parts would not sum "
            "to the total. Put every parameter in one group"
        )


def group_parts(parts: DirectionParts, members: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """``{quantity: {group: sum over its parameters}}`` for quantities ``gTd``, ``dHd``, ``norm2``,
    ``size``. ``members`` (group → parameter names, e.g. from :meth:`ParamSpace.groups`) must
    partition ``parts.names``; the group sums then add up to the totals exactly (fsum)."""
    _check_members(parts.names, members)
    index = {n: i for i, n in enumerate(parts.names)}
    out: dict[str, dict[str, float]] = {"gTd": {}, "dHd": {}, "norm2": {}, "size": {}}
    for gname, ns in members.items():
        idx = [index[n] for n in ns]
        out["gTd"][gname] = float(math.fsum(parts.gTd[i] for i in idx))
        out["dHd"][gname] = float(math.fsum(parts.dHd[i] for i in idx))
        out["norm2"][gname] = float(math.fsum(parts.norm2[i] for i in idx))
        out["size"][gname] = int(sum(parts.numels[i] for i in idx))
    return out


def within_block_curvature(
    op: CurvatureOperator,
    direction: Mapping[str, torch.Tensor] | torch.Tensor,
    groups: Mapping[str, ParamGlobs] | str,
    max_memory: int | str | None = None,
) -> tuple[dict[str, float], int]:
    """``d_bᵀ H_bb d_b`` for every block b: H applied to d masked to each block.

    Args:
        op: an operator with a parameter space; direction: d (dict or flat).
        groups: as :meth:`ParamSpace.groups` accepts (a mapping of globs, ``"module"``,
            ``"parameter"``); they partition the space.
        max_memory: bytes (or ``"8GB"``); the masked copies run in blocks of k that fit it.

    Returns:
        ``({group: d_bᵀ H_bb d_b}, HVPs spent)``. Cost: one HVP per group. Memory: ``2 · k · dim``
        numbers (the masked copies and their products) plus one operator pass.
    """
    check_op(op)
    refuse_sharded(op, "attribution")
    if op.space is None:
        raise EstimatorError("within-block curvature needs an operator with a parameter space (op.space)")
    d = flat_direction(op, direction)
    members = op.space.groups(groups)
    slices = op.space.slices
    names = list(members)
    plan = plan_probe_blocks(op, len(names), None, max_memory, "within-block curvature")
    b = plan.settings["block_size"]
    n0 = op.num_matvecs
    out: dict[str, float] = {}
    with op.configured(**plan.operator_settings):
        for start in range(0, len(names), b):
            chunk = names[start : start + b]
            V = torch.zeros(len(chunk), op.dim, dtype=op.dtype, device=op.device)
            for i, gname in enumerate(chunk):
                for n in members[gname]:
                    V[i, slices[n]] = d[slices[n]]
            quad = rowdot(V, op.matmat_flat(V))
            for i, gname in enumerate(chunk):
                out[gname] = _finite(f"within-block curvature of {gname!r}", quad[i])
            del V
    return out, op.num_matvecs - n0


def attribute(
    op: CurvatureOperator,
    direction: Mapping[str, torch.Tensor] | torch.Tensor,
    groups: Mapping[str, ParamGlobs] | str = "module",
    trace: TraceEstimate | float | None = None,
    trace_matvecs: int = 30,
    seed: int = 0,
    within: bool = False,
    actual: float | None = None,
    max_memory: int | str | None = None,
) -> Attribution:
    """gᵀd and dᵀHd along ``direction``, by factor and by block, with the remainder when ``actual`` is given.

    Args:
        op: an operator with ``gradient()`` and a parameter space (:class:`HessianOperator`).
        direction: d as a dict (keys of ``op.space``) or a flat ``[dim]`` tensor.
        groups: the blocks, as :meth:`ParamSpace.groups` accepts (default one per module).
        trace: tr H of ``op``'s space (a :class:`TraceEstimate` or an exact float) to reuse; None
            estimates it here with :func:`~losslens.geometry.estimators.trace.hutchpp_trace` (``trace_matvecs`` HVPs,
            ``seed``).
        within: also compute ``d_bᵀ H_bb d_b`` per block (one more HVP per block).
        actual: the measured L(θ + d) − L(θ) on the operator's data (for the remainder).
        max_memory: bytes (or ``"8GB"``) for each step (see the module docstring).

    Returns:
        :class:`Attribution`. Cost: one gradient + 1 HVP, + one HVP per block with ``within``, +
        ``trace_matvecs`` HVPs when the trace is estimated here.
    """
    check_op(op)
    refuse_sharded(op, "attribution")
    if op.space is None:
        raise EstimatorError("attribute needs an operator with a parameter space (op.space) to form blocks")
    t0, n0 = time.perf_counter(), op.num_matvecs
    members = op.space.groups(groups)
    parts = direction_parts(op, direction, max_memory=max_memory)
    within_parts = within_block_curvature(op, direction, groups, max_memory)[0] if within else None
    if trace is None:
        trace = hutchpp_trace(
            op, num_matvecs=check_int("trace_matvecs", trace_matvecs, 3), seed=seed, max_memory=max_memory
        )
    return assemble(
        parts,
        members,
        trace,
        within=within_parts,
        actual=actual,
        num_matvecs=op.num_matvecs - n0,
        seconds=time.perf_counter() - t0,
    )


def assemble(
    parts: DirectionParts,
    members: Mapping[str, Sequence[str]],
    trace: TraceEstimate | float,
    within: Mapping[str, float] | None = None,
    actual: float | None = None,
    num_matvecs: int | None = None,
    seconds: float | None = None,
) -> Attribution:
    """An :class:`Attribution` from measured parts (no HVP): block sums over ``members`` (group →
    parameter names, a partition of ``parts.names``), the factors with ``trace`` (of the same
    space), the within-block parts when measured, the remainder when ``actual`` is given.
    ``num_matvecs`` / ``seconds`` default to the parts' own."""
    sums = group_parts(parts, members)
    if within is not None and set(within) != set(members):
        raise EstimatorError(f"within-block parts are for groups {sorted(within)}, the blocks are {sorted(members)}")
    factors = factorise(parts.total_gTd, parts.total_dHd, parts.total_norm2, trace, parts.dim, actual)
    return Attribution(
        factors=factors,
        groups=tuple(members),
        members={k: tuple(v) for k, v in members.items()},
        sizes=sums["size"],
        gTd=sums["gTd"],
        dHd=sums["dHd"],
        norm2=sums["norm2"],
        within=None if within is None else dict(within),
        loss=parts.loss,
        trace=trace if isinstance(trace, TraceEstimate) else None,
        num_matvecs=parts.num_matvecs if num_matvecs is None else num_matvecs,
        num_gradients=parts.num_gradients,
        seconds=parts.seconds if seconds is None else seconds,
        memory=parts.memory,
    )

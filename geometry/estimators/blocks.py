"""Per-block traces: Hutchinson estimates of tr(H_gg) for each parameter group g, from one set of
probes (the same probes as :func:`~losslens.geometry.estimators.trace.hutchinson_trace` with the same seed).

Memory and cost as Hutchinson's (:func:`~losslens.geometry.estimators.sampling.plan_probe_blocks`): one block of
probes and its products plus one operator pass; m probes cost m HVPs.
"""

from __future__ import annotations

import time
from typing import Mapping

from losslens.geometry.estimators._checks import check_int, check_op, refuse_sharded
from losslens.geometry.estimators.sampling import _finite, _interval, _mean_stderr, plan_probe_blocks
from losslens.geometry.estimators.trace import _hutchinson_samples
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.params import ParamGlobs
from losslens.geometry.base.results import BlockTraces, EstimatorError, TraceEstimate

__all__ = ["block_traces"]


def block_traces(
    op: CurvatureOperator,
    groups: Mapping[str, ParamGlobs] | str,
    num_matvecs: int = 100,
    seed: int = 0,
    block_size: int | None = None,
    max_memory: int | str | None = None,
) -> BlockTraces:
    """Hutchinson estimates of tr(H_gg) for each parameter group g, from one set of probes.

    Args:
        op: a curvature operator with a :class:`~losslens.geometry.base.params.ParamSpace` in ``op.space``.
        groups: as :meth:`ParamSpace.groups` accepts: a mapping ``{group: glob(s)}`` (unmatched
            parameters form ``"other"``), ``"module"`` or ``"parameter"``. The groups partition
            the parameters.
        num_matvecs: number of probes m ≥ 1 (= HVPs spent); seed: seed of the probes (the same
            probes as :func:`~losslens.geometry.estimators.trace.hutchinson_trace` with the same seed).
        block_size: probes per ``matmat`` call (default: the fastest that fits ``max_memory``).
        max_memory: as :func:`~losslens.geometry.estimators.trace.hutchinson_trace`. Memory: as Hutchinson's.

    Returns:
        :class:`BlockTraces`; block g's estimate is ``mean_i v_{i,g}ᵀ (H v_i)_g`` and the blocks
        sum to ``total.value`` (the full Hutchinson estimate) up to float64 round-off. Cost: m HVPs.
    """
    check_op(op)
    refuse_sharded(op, "block_traces")
    space = getattr(op, "space", None)
    if space is None:
        raise EstimatorError(
            "block_traces needs an operator with a parameter space (op.space); build it from a model "
            "(HessianOperator) or pass space= to DenseOperator"
        )
    num_matvecs = check_int("num_matvecs", num_matvecs, 1)
    if block_size is not None:
        block_size = check_int("block_size", block_size, 1)
    members = space.groups(groups)
    slices = space.slices
    group_slices = {gname: [slices[n] for n in names] for gname, names in members.items()}
    plan = plan_probe_blocks(op, num_matvecs, block_size, max_memory, "block_traces")
    t0, n0 = time.perf_counter(), op.num_matvecs
    with op.configured(**plan.operator_settings):
        samples, per_group, _ = _hutchinson_samples(
            op, num_matvecs, seed, plan.settings["block_size"], None, group_slices
        )
    m = len(samples)
    values, stderr, ci_low, ci_high = {}, {}, {}, {}
    for gname, x in per_group.items():
        v, se = _mean_stderr(x)
        _finite(f"block trace of group {gname!r}", v)
        values[gname], stderr[gname] = v, se
        ci_low[gname], ci_high[gname] = _interval(v, se, m)
    tv, tse = _mean_stderr(samples)
    seconds = time.perf_counter() - t0
    spent = op.num_matvecs - n0
    tlo, thi = _interval(tv, tse, m)
    total = TraceEstimate(
        value=tv,
        stderr=tse,
        ci_low=tlo,
        ci_high=thi,
        num_matvecs=spent,
        seconds=seconds,
        seed=int(seed),
        method="hutchinson",
        converged=True,
        num_samples=m,
        dim=op.dim,
        memory=plan.to_dict(),
    )
    sizes = {gname: int(sum(s.stop - s.start for s in sl)) for gname, sl in group_slices.items()}
    return BlockTraces(
        values=values,
        stderr=stderr,
        ci_low=ci_low,
        ci_high=ci_high,
        sizes=sizes,
        members={k: tuple(v) for k, v in members.items()},
        total=total,
        num_matvecs=spent,
        seconds=seconds,
        seed=int(seed),
    )

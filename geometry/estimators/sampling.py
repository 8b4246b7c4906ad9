"""Rademacher probes, their statistics and the memory plan of probes in blocks: what the stochastic
estimators (:mod:`losslens.geometry.estimators.trace`, :mod:`losslens.geometry.estimators.blocks`,
:mod:`losslens.geometry.estimators.density`, :mod:`losslens.geometry.estimators.attribution`) share.

Probes are Rademacher (±1 entries), drawn from ``op.generator(seed)`` (a CPU generator; probes are
moved to the operator's device) in blocks: the stream does not depend on the block size, so the same
seed gives bit-identical probes on every device, run and memory plan. Per-probe samples are reduced
in float64; the interval of a mean of n samples is Student-t on n − 1 degrees of freedom.

Memory of m probes in blocks of k (:func:`plan_probe_blocks`; n = dim, b = bytes of ``op.dtype``):
one block of probes and its products, ``2 · k · n · b``, plus one operator pass; the fastest block
size and graph cache within the budget are chosen.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from losslens.geometry.base._linalg import rademacher_rows
from losslens.geometry.memory.model import (
    Candidate,
    MemoryEstimate,
    choose,
    pass_options,
    TEMPORARIES_PART,
    temporaries_bytes,
    vector_bytes,
)
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.operators.interface import CurvatureOperator
from losslens.geometry.base.results import EstimatorError

__all__ = ["rademacher", "t_quantile", "plan_probe_blocks"]

DEFAULT_BLOCK_SIZE = 16
_BLOCKS = (16, 8, 4, 2, 1)
_ADVICE = (
    "use fewer or shorter curvature batches (the graph of one batch dominates), select fewer parameters "
    "(params=...), or raise max_memory"
)


def rademacher(generator: torch.Generator, k: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[k, dim]`` i.i.d. ±1 entries from a CPU ``generator``, cast to ``dtype`` on ``device``.
    Drawing k rows at once or in several calls gives the same numbers; with sharded vectors, this
    rank's columns of them (``losslens.geometry.base._linalg.rademacher_rows``)."""
    return rademacher_rows(generator, k, dim, dtype, device)


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for ``n`` samples (n − 1 degrees of freedom); inf for n < 2."""
    if n < 2:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, n - 1))


def _mean_stderr(samples: np.ndarray) -> tuple[float, float]:
    n = samples.shape[0]
    mean = float(samples.mean())
    if n < 2:
        return mean, math.inf
    return mean, float(samples.std(ddof=1) / math.sqrt(n))


def _interval(value: float, stderr: float, n: int) -> tuple[float, float]:
    if stderr == 0.0:
        return value, value
    if not math.isfinite(stderr):
        return -math.inf, math.inf
    h = t_quantile(n) * stderr
    return value - h, value + h


def _finite(name: str, *xs: float) -> None:
    for x in xs:
        if not math.isfinite(x):
            raise EstimatorError(f"{name} is not finite ({x}); check the loss and the operator")


def _blocks(m: int, block_size: int | None) -> list[int]:
    return [block_size] if block_size is not None else sorted({min(m, b) for b in _BLOCKS}, reverse=True)


def plan_probe_blocks(op: CurvatureOperator, m: int, block_size: int | None, max_memory, what: str) -> MemoryEstimate:
    """Memory plan of m probes in blocks (Hutchinson, block traces): the fastest block size and
    graph cache within the budget. Memory: ``2 · block · dim`` vectors + one pass."""
    budget = resolve_budget(op.max_memory if max_memory is None else max_memory, op.device)
    vec = vector_bytes(op.dim, op.dtype)
    cands = []
    for b in _blocks(m, block_size):
        calls = math.ceil(m / b)
        for settings, pass_b, cost in pass_options(op, b, calls, m):
            parts = {
                f"probes [{b}, dim]": b * vec,
                f"products [{b}, dim]": b * vec,
                "operator pass": pass_b,
                TEMPORARIES_PART: temporaries_bytes(op.dim, op.dtype),
            }
            cands.append(Candidate(MemoryEstimate(parts, budget, {"block_size": b, **settings}), cost))
    return choose(cands, what, _ADVICE)

"""The gradient-difference backend's error, measured against exact products (docs/science.md §4 (c)).

:func:`product_error` compares two operators on seeded vectors; :func:`measure` runs it for a
:class:`~losslens.geometry.operators.difference.DifferenceBackend` against the exact reverse-over-reverse
products of the same loss on a check slice, planned against the operator's budget first
(:func:`check_bytes`); an error that cannot be measured is recorded with the reason, never assumed.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from losslens.geometry.base._linalg import CHUNK
from losslens.geometry.memory.graphs import one_row
from losslens.geometry.memory.model import temporaries_bytes
from losslens.geometry.operators.interface import CurvatureOperator, OperatorError

__all__ = ["product_error", "check_bytes", "measure"]


def product_error(op: CurvatureOperator, reference: CurvatureOperator, num_vectors: int = 2, seed: int = 0) -> float:
    """Largest relative error ``‖op v − ref v‖ / ‖ref v‖`` over ``num_vectors`` seeded Gaussian
    vectors, one vector at a time, norms summed in float64 a chunk at a time. Cost: ``num_vectors``
    products of each operator. Memory beyond the products' passes: three ``[1, dim]`` vectors in
    the operators' vector dtype (v, op v, ref v) and float64 chunks (:func:`check_bytes`)."""
    if op.dim != reference.dim:
        raise OperatorError(f"the operators have different dimensions ({op.dim} and {reference.dim})")
    g = op.generator(seed)
    worst = 0.0
    for _ in range(num_vectors):
        v = torch.randn(1, op.dim, generator=g, dtype=op.dtype)
        got = op.matmat_flat(v.to(device=op.device))
        ref = reference.matmat_flat(v.to(device=reference.device, dtype=reference.dtype))
        del v
        num, den = _difference_norms(got[0], ref[0].to(got.device))
        worst = max(worst, num / max(den, 1e-300))
        del got, ref
    return worst


def _difference_norms(a: torch.Tensor, b: torch.Tensor, chunk: int = CHUNK) -> tuple[float, float]:
    """``(‖a − b‖, ‖b‖)`` of two flat vectors, in float64 one chunk at a time (no full-size copy)."""
    num = den = 0.0
    for s in range(0, a.numel(), chunk):
        y = b[s : s + chunk].double()
        num += float((a[s : s + chunk].double() - y).square().sum())
        den += float(y.square().sum())
    return math.sqrt(num), math.sqrt(den)


def check_bytes(op: Any, *passes: int) -> int:
    """Peak bytes of :func:`product_error` on operators of ``op.dim`` whose single-vector passes
    take ``passes`` bytes: three vectors of the vector dtype, the larger pass (the products run
    one after the other) and three float64 chunks."""
    return 3 * op.dim * op.dtype.itemsize + max(passes, default=0) + temporaries_bytes(op.dim)


def _describe(batches: Sequence[Any]) -> str:
    shapes = [list(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__ for b in batches]
    return f"{len(batches)} check batch(es) {shapes}"


def measure(op: Any, backend: Any, num_vectors: int = 2, seed: int = 0) -> dict:
    """The difference backend's relative error (:func:`product_error`) against the exact
    reverse-over-reverse products of the same loss on ``backend.check_batches`` (default: a one-row
    copy of the first batch), on ``num_vectors`` seeded vectors; ``op.sibling(batches, backend)``
    builds the operators. When the exact product cannot run there (no double-backward rule, or out of
    memory) ``rel_error`` is None and ``reference`` says why: bound it elsewhere (e.g. on a miniature
    of the architecture, :func:`losslens.lm.models.miniature.miniature_bound`); so it is when the check's
    memory (:func:`check_bytes`: three vectors and the larger single-vector pass) exceeds the
    operator's budget. Cost: 2 · num_vectors products of each backend on the check slice (plus one
    reverse graph build)."""
    from losslens.geometry.operators.reverse import ReverseBackend
    from losslens.geometry.operators.smoothness import activation_smoothness

    batches = list(backend.check_batches) if backend.check_batches is not None else [one_row(op.batches[0])[1]]
    out = {
        "backend": backend.name,
        "step": backend.step(op),
        "richardson": backend.richardson,
        "non_smooth_activations": activation_smoothness(op.model)[1],
        "num_vectors": num_vectors,
        "seed": seed,
    }
    diff = op.sibling(batches, type(backend)(backend.h, backend.richardson))  # its step and stencil, no check
    try:
        from losslens.geometry.memory.budget import format_bytes, resolve_budget

        reference = op.sibling(batches, ReverseBackend())
        need = check_bytes(op, diff.pass_bytes(1), reference.pass_bytes(1, cached=False))
        budget = resolve_budget(op.max_memory, op.device)
        if need > budget:  # planned like any estimator: never an allocation the budget did not allow
            return {
                **out,
                "rel_error": None,
                "reference": f"not run on {_describe(batches)}: the exact check needs "
                f"{format_bytes(need)} of a {format_bytes(budget)} budget (bound it on a miniature instead)",
            }
        error = product_error(diff, reference, num_vectors, seed)
    except (RuntimeError, NotImplementedError, OperatorError) as exc:  # recorded, never silent
        return {
            **out,
            "rel_error": None,
            "reference": f"unavailable on {_describe(batches)}: {type(exc).__name__}: {exc}"[:300],
        }
    dtype = str(op.param_dtype).replace("torch.", "")
    return {**out, "rel_error": error, "reference": f"reverse-over-reverse ({dtype}) on {_describe(batches)}"}

"""Product backends: the ways a :class:`~losslens.geometry.operators.hessian.HessianOperator` computes ``H V``.

A backend is an object behind one small interface (:class:`ProductBackend`):

- :meth:`~ProductBackend.products`: ``outs += Σ_b w_b H_b V`` for a ``[k, dim]`` block given per
  parameter, over the operator's batches;
- :meth:`~ProductBackend.pass_bytes`: the bytes of one such pass beyond its input and output, and
  :meth:`~ProductBackend.pass_options`: the settings an estimator's memory plan may choose from;
- :meth:`~ProductBackend.check`: its error against an exact reference (None for exact backends).

The backends: :class:`~losslens.geometry.operators.reverse.ReverseBackend` (reverse-over-reverse, the
default), :class:`~losslens.geometry.operators.forward.ForwardBackend` (forward-over-reverse) and
:class:`~losslens.geometry.operators.difference.DifferenceBackend` (gradient differences, first order only).
``"auto"`` is :class:`~losslens.geometry.operators.auto.AutoBackend`: it prices the exact and the difference
pass and returns one of them with its reason. :func:`losslens.geometry.operators.names.backend_named` is the
one place where a backend's name is read: everywhere else a backend is an object, asked what it does.

The backends, in detail (each computes the Hessian of the operator's weighted mean loss):

``"reverse"`` (default), reverse-over-reverse
    Per data batch the gradient ``g = ∇L_b`` is built once with ``create_graph=True`` and that graph
    is reused for all k vectors: ``H_b v = ∇(g · v)``. The k second backwards run either as one
    vmapped backward (``is_grads_batched=True``, ``vectorize=True``) or as k sequential backwards on
    the retained graph (``vectorize=False``; ``ReverseBackend(vectorize=..., cache_graphs=...)``).
    Only one batch's graph is alive at a time (batches
    outer, chunks of vectors inner), unless graphs are kept between calls (``cache_graphs``): then
    every batch's graph stays alive until a parameter or buffer changes (its identity, version or
    content: :mod:`losslens.geometry.operators.fingerprint`, one read of the model per call) or
    :meth:`~losslens.geometry.operators.hessian.HessianOperator.release_graphs`, so an
    iterative solver (power iteration, Lanczos, SLQ) pays the graph build once, not every step.
``"forward"``, forward-over-reverse
    ``torch.func.jvp`` of ``torch.func.grad`` over ``torch.func.functional_call``, vmapped over the
    k tangents (chunked). Non-selected parameters and buffers enter as constants. It rebuilds the
    forward and gradient for every chunk, so it costs more per vector than ``"reverse"`` on CPU.

``"difference"``, gradient differences (:mod:`losslens.geometry.operators.difference`)
    ``(∇L(θ+εv) − ∇L(θ−εv))/2ε`` from ``loss.backward()`` and ``.grad`` with θ perturbed in place
    and restored bit-exactly: first order only (fused attention, activation checkpointing, fused losses);
    2 gradients per product (4 with ``richardson=True``; ``DifferenceBackend(step, richardson,
    check_batches, tolerance)``); its error against the exact products is
    measured on a check slice (:meth:`~losslens.geometry.operators.hessian.HessianOperator.checked`) and recorded
    in every estimator plan.
``"auto"``
    ``"reverse"`` when its pass fits ``max_memory``, else ``"difference"`` when its pass fits and its
    error is ≤ the difference backend's ``tolerance`` (else :class:`OperatorError`); why: ``backend_choice``.

The gradient-difference loop measures vectors through a :class:`VectorSpace`: whole vectors on this
rank (:data:`LOCAL`) or a rank's shards of a global vector whose sums are all-reduced
(:class:`ReducedVectors`, the FSDP2 operator), so one loop serves both.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Callable, ClassVar, ContextManager, Sequence

import torch
from torch import nn

from losslens.geometry.base._linalg import power_sums

__all__ = ["ProductBackend", "VectorSpace", "LocalVectors", "ReducedVectors", "LOCAL"]


class VectorSpace:
    """How the product loop measures a vector given as a list of parts: ``norm`` (‖x‖₂), ``norms``
    (‖x‖₂, ‖x‖₄²) and ``numel`` (its length), each over the whole vector."""

    def norm(self, parts: Sequence[torch.Tensor]) -> float:
        raise NotImplementedError

    def norms(self, parts: Sequence[torch.Tensor]) -> tuple[float, float]:
        raise NotImplementedError

    def numel(self, parts: Sequence[torch.Tensor]) -> int:
        raise NotImplementedError


class LocalVectors(VectorSpace):
    """Whole vectors on this rank (one process, or data-parallel ranks that each hold every
    parameter): sums in float64, a chunk at a time; ‖x‖₄² from x / max|x| (no overflow or underflow
    of the fourth powers). Temporaries: one float64 chunk."""

    def norm(self, parts: Sequence[torch.Tensor]) -> float:
        return math.sqrt(sum(power_sums(t)[0] for t in parts))

    def norms(self, parts: Sequence[torch.Tensor]) -> tuple[float, float]:
        vmax = max(max(-float(lo), float(hi)) for lo, hi in (t.aminmax() for t in parts))
        if vmax == 0.0:
            return 0.0, 0.0
        s2 = s4 = 0.0
        for t in parts:
            a, b = power_sums(t, vmax)
            s2, s4 = s2 + a, s4 + b
        return vmax * math.sqrt(s2), vmax * vmax * math.sqrt(s4)

    def numel(self, parts: Sequence[torch.Tensor]) -> int:
        return sum(t.numel() for t in parts)


class ReducedVectors(VectorSpace):
    """This rank's shards of a global vector of ``global_numel`` numbers: local float64 power sums,
    then summed over the ranks by ``sum_floats`` (one all-reduce of two floats per norm)."""

    def __init__(self, sum_floats: Callable[[list[float]], list[float]], global_numel: int):
        self.sum_floats, self.global_numel = sum_floats, int(global_numel)

    def _sums(self, parts: Sequence[torch.Tensor]) -> tuple[float, float]:
        s2 = s4 = 0.0
        for t in parts:
            a, b = power_sums(t)
            s2, s4 = s2 + a, s4 + b
        s2, s4 = self.sum_floats([s2, s4])
        return s2, s4

    def norm(self, parts: Sequence[torch.Tensor]) -> float:
        return math.sqrt(self._sums(parts)[0])

    def norms(self, parts: Sequence[torch.Tensor]) -> tuple[float, float]:
        s2, s4 = self._sums(parts)
        return math.sqrt(s2), math.sqrt(s4)

    def numel(self, parts: Sequence[torch.Tensor]) -> int:
        return self.global_numel


#: Whole vectors on this rank.
LOCAL = LocalVectors()


class ProductBackend(abc.ABC):
    """One way to compute Hessian-vector products of a :class:`~losslens.geometry.operators.hessian.HessianOperator`.

    ``op`` below is the operator; a backend reads its public surface only (``model``, ``space``,
    ``batches``, ``batch_items``, ``batch_loss``, ``call_context``, ``graph_bytes``, dtypes,
    ``chunk_size``, ``can_keep_graphs``, ``loss_transient_bytes``, ``max_memory``, ``measured_passes``).
    A backend holds its own settings (the reverse backend's ``vectorize`` and ``cache_graphs``, the
    difference backend's step, stencil, check batches and tolerance) and whatever it keeps between
    one operator's calls (the reverse backend's gradient graphs): an operator keeps
    :meth:`for_operator` of the backend it is given, so one configured object may be handed to
    several operators.
    """

    #: the name :func:`~losslens.geometry.operators.names.backend_named` knows it by; recorded in results
    # (``"backend"``)
    name: ClassVar[str]
    #: products are exact up to rounding (no measured error needed)
    exact: ClassVar[bool] = True
    #: needs second-order autograd rules (double backward or forward AD) on the model's ops
    second_order: ClassVar[bool] = True
    #: keeps gradient graphs between calls when ``cache_graphs`` is on
    keeps_graphs: ClassVar[bool] = False
    #: may differentiate the lean closed-form LM head (:func:`losslens.lm.core.lm_head.lm_loss_lean`), whose
    #: second derivative has a reverse-mode rule only
    lean_head: ClassVar[bool] = False
    #: runs on FSDP2-sharded parameters (first-order gradients only: no double backward there)
    shardable: ClassVar[bool] = False
    #: what it is, in a few words (the CLI's ``--backend`` help)
    summary: ClassVar[str] = ""

    def for_operator(self) -> "ProductBackend":
        """The object one operator keeps: this one (settings only); a backend that keeps state between
        an operator's calls returns a copy of its settings with none kept."""
        return self

    def release_graphs(self) -> None:
        """Free what it keeps between calls (the reverse backend's gradient graphs); nothing here."""

    @property
    def kept_graphs(self) -> int:
        """Gradient graphs kept between calls now; the default backend keeps none."""
        return 0

    def attention(self, model: nn.Module) -> ContextManager:
        """The attention context of a product (default: SDPA's twice-differentiable MATH kernel)."""
        from losslens.geometry.operators.attention import second_order_attention

        return second_order_attention()

    @abc.abstractmethod
    def products(
        self, op: Any, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]
    ) -> None:
        """``outs[j] += Σ_b w_b (H_b V)_j`` over the operator's batches, V given per parameter as
        ``vs[j]`` ``[k, *shape_j]`` in the vector dtype; ``params``: the selected live parameters."""

    @abc.abstractmethod
    def pass_bytes(self, op: Any, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """Predicted peak bytes of one product of ``k`` vectors beyond its input and output."""

    def pass_options(self, op: Any, k: int, calls: int, hvps: int) -> list[tuple[dict[str, Any], int, float]]:
        """``(settings, pass bytes, cost in gradient-equivalents)`` of the ways to run ``calls``
        products of at most ``k`` vectors (``hvps`` in all): ``losslens.geometry.memory.model.pass_options``."""
        return [({"cache_graphs": False}, op.pass_bytes(k, cached=False), 2.0 * hvps)]

    def check(self, op: Any) -> dict | None:
        """The products' measured error against an exact reference; None for an exact backend."""
        return None

    def refined(self, op: Any) -> "ProductBackend | None":
        """A more accurate backend for a few products (an eigen solve's final Rayleigh quotients),
        or None when there is none (exact backends)."""
        return None

    def step(self, op: Any) -> float | None:
        """The relative step of a finite-difference backend (None for exact ones)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

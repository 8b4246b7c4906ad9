"""Reverse-over-reverse Hessian-vector products on one batch's retained gradient graph.

:class:`ReverseBackend` (``backend="reverse"``, the default of
:class:`losslens.geometry.operators.hessian.HessianOperator`): the
gradient ``g = ∇L_b`` is built once with ``create_graph=True`` (:class:`GradientGraph`), then
``H_b v = ∇(g · v)`` is one more backward per vector (``vectorize=False``) or one vmapped
backward per chunk of vectors (``vectorize=True``, ``is_grads_batched``). Memory: the graph
plus one chunk's second-backward intermediates (:func:`losslens.geometry.memory.graphs.pass_bytes`).
The backend holds its settings (``vectorize``, ``cache_graphs``) and the operator's kept graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from losslens.geometry.memory.graphs import one_row, pass_bytes, saved_graph_bytes
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.derivatives import check_dead_rows
from losslens.geometry.operators.fingerprint import model_fingerprint
from losslens.geometry.operators.interface import OperatorError


@dataclass
class GradientGraph:
    """One batch's gradient with its graph: the live gradients (those that have a graph) and
    which selected tensors they belong to."""

    loss: torch.Tensor
    outputs: list[torch.Tensor]
    live: list[int]


def gradient_graph(loss: torch.Tensor, tensors: list[torch.Tensor]) -> GradientGraph:
    """The gradient of ``loss`` w.r.t. ``tensors`` with ``create_graph=True``; a gradient without
    a graph (it does not depend on θ: a zero Hessian row) is left out of ``outputs``."""
    grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True, materialize_grads=True)
    live = [j for j, g in enumerate(grads) if g.requires_grad]
    return GradientGraph(loss, [grads[j] for j in live], live)


def reverse_products(
    graph: GradientGraph,
    tensors: list[torch.Tensor],
    vs: list[torch.Tensor],
    outs: list[torch.Tensor],
    weight: float,
    chunk: int,
    vectorize: bool,
    param_dtype: torch.dtype,
) -> None:
    """``outs[j] += weight · (H_b V)_j`` for V given per parameter as ``vs[j]`` ``[k, *shape_j]``
    (in the estimator dtype; converted to ``param_dtype`` a chunk at a time)."""
    if not graph.live:
        return
    k = vs[0].shape[0]
    for start in range(0, k, chunk):
        stop = min(start + chunk, k)
        if vectorize:
            hv = torch.autograd.grad(
                graph.outputs,
                tensors,
                grad_outputs=[vs[j][start:stop].to(param_dtype) for j in graph.live],
                retain_graph=True,
                is_grads_batched=True,
                allow_unused=True,
                materialize_grads=True,
            )
            for o, h in zip(outs, hv):
                o[start:stop].add_(h, alpha=weight)
            continue
        for r in range(start, stop):
            hv = torch.autograd.grad(
                graph.outputs,
                tensors,
                grad_outputs=[vs[j][r].to(param_dtype) for j in graph.live],
                retain_graph=True,
                allow_unused=True,
                materialize_grads=True,
            )
            for o, h in zip(outs, hv):
                o[r].add_(h, alpha=weight)
            del hv


def check_loss(loss: Any, index: int, finite: bool = True) -> None:
    """Raise :class:`OperatorError` unless ``loss`` (of batch ``index``) is a floating-point scalar
    tensor, and, with ``finite``, a finite one."""
    if not isinstance(loss, torch.Tensor):
        raise OperatorError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} on batch {index}")
    if loss.ndim != 0:
        raise OperatorError(
            f"loss_fn must return a scalar (0-dim) mean loss; got shape {tuple(loss.shape)} on batch {index}"
        )
    if not loss.is_floating_point():
        raise OperatorError(f"loss_fn returned a {loss.dtype} tensor; the loss must be floating point")
    if finite and not torch.isfinite(loss.detach()).all():
        raise OperatorError(
            f"the loss is {float(loss.detach())} on batch {index}; the Hessian of a non-finite loss is undefined"
        )


@dataclass
class GraphCache:
    """An operator's kept gradient graphs (``cache_graphs``): per batch index, valid while the model's
    :func:`~losslens.geometry.operators.fingerprint.model_fingerprint` is ``fingerprint``; ``dead_checked``:
    the dead-row check ran once."""

    graphs: dict[int, GradientGraph] = field(default_factory=dict)
    fingerprint: tuple | None = None
    dead_checked: bool = False

    def release(self) -> None:
        self.graphs.clear()
        self.fingerprint = None


class ReverseBackend(ProductBackend):
    """Reverse-over-reverse products: per batch one ``create_graph`` gradient, then one second backward
    per vector (``vectorize=False``) or per chunk (vmapped). Memory: the graph of the largest batch
    (of every batch when graphs are kept) plus the second backward's transient
    (:func:`losslens.geometry.memory.graphs.pass_bytes`).

    Args:
        vectorize: ``True`` one vmapped second backward per chunk, ``False`` k sequential second
            backwards on the retained graph, ``"auto"`` (default) the measured faster one for the
            operator's device (sequential on CPU, vectorized on CUDA: :data:`AUTO_VECTORIZE_CPU`).
        cache_graphs: keep every batch's gradient graph between calls (until a parameter or buffer
            changes, ``.data`` writes included, or :meth:`release_graphs`; checking costs one read of
            the model per call). Estimators switch it on themselves when it fits their memory budget
            (:meth:`~losslens.geometry.operators.hessian.HessianOperator.configured`).

    The kept graphs (:class:`GraphCache`) are per-operator state: an operator keeps its own copy of
    the backend it is given (:meth:`for_operator`).
    """

    name = "reverse"
    keeps_graphs = True
    lean_head = True
    summary = "exact"

    def __init__(self, vectorize: bool | Literal["auto"] = "auto", cache_graphs: bool = False):
        if vectorize not in (True, False, "auto"):
            raise OperatorError(f"vectorize must be True, False or 'auto', got {vectorize!r}")
        self.vectorize, self.cache_graphs = vectorize, bool(cache_graphs)
        #: the kept gradient graphs (``cache_graphs``)
        self.graphs = GraphCache()

    def __repr__(self) -> str:
        return f"ReverseBackend(vectorize={self.vectorize!r}, cache_graphs={self.cache_graphs})"

    def for_operator(self) -> "ReverseBackend":
        """The same settings with no graphs kept: what one operator holds."""
        return ReverseBackend(self.vectorize, self.cache_graphs)

    def vectorized(self, op: Any) -> bool:
        """Whether the second backwards are vmapped on ``op``'s device (``vectorize``, "auto" resolved)."""
        if self.vectorize == "auto":
            return op.device.type != "cpu" or AUTO_VECTORIZE_CPU
        return bool(self.vectorize)

    def caching(self, op: Any) -> bool:
        """Whether ``op``'s graphs are kept between calls: ``cache_graphs`` where the operator can keep them."""
        return self.cache_graphs and op.can_keep_graphs

    def release_graphs(self) -> None:
        self.graphs.release()

    @property
    def kept_graphs(self) -> int:
        return len(self.graphs.graphs)

    def products(
        self, op: Any, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]
    ) -> None:
        cache, vectorize = self.graphs, self.vectorized(op)
        chunk = op.chunk_for(vs[0].shape[0], vectorize)
        if self.caching(op):  # kept graphs are the Hessian at the weights they were built on
            fp = model_fingerprint(op.model)  # identity, version and content of every tensor (.data writes too)
            if fp != cache.fingerprint:
                cache.graphs.clear()
                cache.fingerprint = fp
        for i, (w, batch) in op.batch_items("hvp"):
            graph = self._graph(op, params, batch, i)
            reverse_products(graph, list(params.values()), vs, outs, w, chunk, vectorize, op.param_dtype)
            del graph  # not cached: this batch's graph is freed before the next batch

    def _graph(self, op: Any, params: dict[str, torch.Tensor], batch: Any, index: int) -> GradientGraph:
        """Batch ``index``'s gradient graph: from the cache when kept and still valid, else built."""
        cache, keep = self.graphs, self.caching(op)
        if keep and index in cache.graphs:  # valid: checked once per call in products
            return cache.graphs[index]
        tensors = list(params.values())
        graph = gradient_graph(op.batch_loss(params, batch, index), tensors)
        op.num_graph_builds += 1
        # a gradient that does not depend on θ has a zero Hessian row: right for a loss linear in
        # that tensor, wrong when an op's backward is not differentiable -> checked once
        if len(graph.live) < len(tensors) and not cache.dead_checked:
            cache.dead_checked = True
            check_dead_rows(
                lambda: op.batch_loss(params, batch, index),
                params,
                [j for j in range(len(tensors)) if j not in graph.live],
            )
        if keep:
            cache.graphs[index] = graph
        return graph

    def pass_bytes(self, op: Any, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        graphs = [op.graph_bytes(i) for i in range(len(op.batches))]
        chunk = chunk or op.chunk_for(k, True)
        vectorize = self.vectorized(op)
        return pass_bytes(
            graphs,
            op.dim * op.param_dtype.itemsize,
            vectorize,
            k,
            chunk,
            self.caching(op) if cached is None else cached,
            op.loss_transient_bytes + converted_bytes(op, k, chunk, vectorize),
        )

    def pass_options(self, op: Any, k: int, calls: int, hvps: int) -> list[tuple[dict[str, Any], int, float]]:
        """Graphs rebuilt per call or kept; vmapped chunk sizes. Cost: 1.5 per graph build of every
        batch, 2 per vector (the measured shape), + 0.01 per vmapped chunk (larger ones run faster)."""
        chunks = _chunks(k) if self.vectorized(op) and op.chunk_size is None else [None]
        return [
            _option(op, k, chunk, cache, 1.5 * (1 if cache else calls) + 2.0 * hvps, hvps)
            for chunk in chunks
            for cache in ((False, True) if calls > 1 and getattr(op, "can_keep_graphs", True) else (False,))
        ]


def graph_bytes(op: Any, index: int) -> int:
    """Bytes of batch ``index``'s double-backward graph: the tensors autograd saves for the forward
    and the ``create_graph`` backward, plus the first-order gradients. Measured once per batch shape
    on a one-row copy, under the exact backends' attention (:mod:`losslens.geometry.memory.graphs`; cost: one
    small gradient) and kept in ``op.measured_passes``."""
    rows, sliced, key = one_row(op.batches[index])
    if key not in op.measured_passes:

        def build():
            loss = op.batch_loss(params, sliced, index)
            torch.autograd.grad(loss, list(params.values()), create_graph=True, allow_unused=True)

        with op.call_context(ReverseBackend()) as params:
            op.measured_passes[key] = saved_graph_bytes(op.model, build)
    return int(op.measured_passes[key] * rows + op.dim * op.param_dtype.itemsize)


def converted_bytes(op: Any, k: int, chunk: int, vectorize: bool) -> int:
    """Half models: each float32 vector is converted to the parameters' dtype, and adding a half
    product into a float32 output casts it a parameter at a time (the largest, per vector in flight:
    ``min(k, chunk)`` vmapped, one with ``vectorize`` False); 0 when the vectors are in the parameters' dtype."""
    if op.dtype == op.param_dtype:
        return 0
    largest = max((math.prod(s) for s in op.space.shapes), default=0)
    return op.dim * op.param_dtype.itemsize + (min(k, chunk) if vectorize else 1) * largest * op.dtype.itemsize


def _chunks(k: int) -> list[int]:
    """The vmapped chunk sizes a plan may choose for k vectors, largest first."""
    return sorted({min(k, c) for c in (16, 8, 4, 2, 1)}, reverse=True)


def _option(
    op: Any, k: int, chunk: int | None, cache: bool, cost: float, hvps: int
) -> tuple[dict[str, Any], int, float]:
    """One ``(settings, pass bytes, cost)`` of an exact backend's plan (``backend_choice`` recorded
    when ``backend="auto"`` chose it)."""
    settings: dict[str, Any] = {"cache_graphs": cache}
    if getattr(op, "backend_choice", None):  # backend="auto" chose the exact backend: say why
        settings["backend_choice"] = op.backend_choice
    if chunk is not None:
        settings["chunk_size"] = chunk
        cost += 0.01 * hvps / chunk  # larger vmapped chunks run faster
    return settings, op.pass_bytes(k, cached=cache, chunk=chunk), cost


#: Measured choice for ``vectorize="auto"`` on CPU (benchmarks/README.md, "HVP throughput").
AUTO_VECTORIZE_CPU = False

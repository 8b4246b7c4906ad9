"""Hessian-vector products of a model's loss, batched over k vectors (docs/science.md §4).

:class:`HessianOperator` is the Hessian ``H = ∇²_θ L(θ)`` of the weighted mean loss

    L(θ) = Σ_b w_b · loss_fn(model, batch_b),      Σ_b w_b = 1,

with respect to a declared parameter set θ (globs over parameter names), applied to blocks of k
vectors without ever forming H. Three backends compute the same products (``"auto"`` picks one):

``"reverse"`` (default), reverse-over-reverse
    Per data batch the gradient ``g = ∇L_b`` is built once with ``create_graph=True`` and that graph
    is reused for all k vectors: ``H_b v = ∇(g · v)``. The k second backwards run either as one
    vmapped backward (``is_grads_batched=True``, ``vectorize=True``) or as k sequential backwards on
    the retained graph (``vectorize=False``). Only one batch's graph is alive at a time (batches
    outer, chunks of vectors inner), unless graphs are kept between calls (``cache_graphs``): then
    every batch's graph stays alive until a parameter or buffer changes (its identity, version or
    content: :mod:`geometry.operators.fingerprint`, one read of the model per call) or
    :meth:`release_graphs`, so an
    iterative solver (power iteration, Lanczos, SLQ) pays the graph build once, not every step.
``"forward"``, forward-over-reverse
    ``torch.func.jvp`` of ``torch.func.grad`` over ``torch.func.functional_call``, vmapped over the
    k tangents (chunked). Non-selected parameters and buffers enter as constants. It rebuilds the
    forward and gradient for every chunk, so it costs more per vector than ``"reverse"`` on CPU.

``"difference"``, gradient differences (:mod:`geometry.operators.difference`)
    ``(∇L(θ+εv) − ∇L(θ−εv))/2ε`` from ``loss.backward()`` and ``.grad`` with θ perturbed in place
    and restored bit-exactly: first order only (fused attention, activation checkpointing, fused losses);
    2 gradients per product (4 with ``richardson=True``); its error against the exact products is
    measured on a check slice (:meth:`checked`) and recorded in every estimator plan.
``"auto"``
    ``"reverse"`` when its pass fits ``max_memory``, else ``"difference"`` when its pass fits and its
    error is ≤ ``difference_tolerance`` (else :class:`OperatorError`); why: ``backend_choice``.

``vectorize="auto"`` picks the sequential second backwards on CPU (measured faster there, see
benchmarks/README.md, "HVP throughput") and the vectorized one on CUDA.

Precision: products run in the model's dtype. Vectors in and out of :meth:`matmat_flat` and all
accumulation over batches are in :attr:`dtype`, which is float32 for a float16/bfloat16 model
(the model's dtype otherwise), so estimator linear algebra never runs in half precision. To
compute the products themselves in float32, load the model in float32.

Memory: :meth:`pass_bytes` predicts the peak of one product of k vectors beyond the vectors
themselves, from the double-backward graph of the largest batch measured once (saved-tensor
hooks on one row of each batch shape): see :mod:`geometry.memory.model` and benchmarks/README.md
("Scale") for the check against measured peaks.

Conventions, side effects and guarantees of every call:

- attention runs under :func:`geometry.operators.attention.second_order_attention` (SDPA MATH backend), and
  embeddings' ``padding_idx`` is cleared (:func:`geometry.operators.derivatives.true_derivatives`), so the
  products are those of the loss the forward computes;
- the model is put in **eval mode** for the call, and every submodule's previous mode is restored;
- ``.grad`` of every parameter is left as it was: products use ``torch.autograd.grad``;
  parameters outside the selection are frozen for the call only (so no graph is kept for layers
  that lead to no selected parameter: curvature of the last blocks needs the graph of those blocks
  only); ``requires_grad`` flags and parameter values are restored;
- a selected parameter whose gradient has no autograd graph (a zero Hessian row) is checked once
  with a finite difference of gradients: a loss linear in it passes, a non-differentiable backward
  on its path raises :class:`~geometry.operators.interface.OperatorError` instead of a silent zero row;
- grad mode is switched on internally, so calls work inside ``torch.no_grad()``;
- ``data_parallel``: each rank passes its share of the batches; products, gradients and memory plans
  are those of all ranks' batches together (:mod:`geometry.operators.parallel`).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import torch
from torch import nn

from ._forward import forward_over_reverse
from ._reverse import GradientGraph, check_loss, gradient_graph, reverse_products
from .attention import second_order_attention
from ..base.batches import normalise_batch_weights
from .derivatives import check_dead_rows, true_derivatives
from .difference import DEFAULT_TOLERANCE, checkpointing_layers, choose_backend, difference_products, measure, relative_step
from .difference import operator_pass_bytes as difference_pass_bytes
from .fingerprint import model_fingerprint
from ..memory.graphs import itemsize, one_row, pass_bytes, saved_graph_bytes
from ..base.modes import module_modes
from .interface import CurvatureOperator, OperatorError, estimator_dtype, is_finite
from .parallel import DataParallel, join_data_parallel
from ..base.params import ParamGlobs, ParamSpace, select_parameters

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Backend = Literal["reverse", "forward", "difference", "auto"]
BACKENDS = ("reverse", "forward", "difference", "auto")

#: Default bound on k per pass for the vmapped passes (vectorized reverse, forward). A vmapped
#: pass holds ~k copies of the backward's intermediates, so memory grows linearly with the chunk.
DEFAULT_CHUNK = 16


class HessianOperator(CurvatureOperator):
    """Hessian of ``Σ_b w_b loss_fn(model, batch_b)`` w.r.t. selected parameters, as an operator.

    Args:
        model: any ``nn.Module``; read live at each call (weights copied into it later are used).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` (mean loss of the batch), e.g.
            :func:`probes.core.lm.lm_loss`.
        batches: non-empty sequence of batches (anything ``loss_fn`` accepts).
        params: ``None`` (every parameter with ``requires_grad``), a glob or a list of globs over
            parameter names (:func:`geometry.base.params.select_parameters`).
        weights: one non-negative weight per batch, normalised to sum 1; default
            :func:`~geometry.base.batches.default_batch_weight` (``loss_fn.batch_weight``: tokens; else rows).
        backend: ``"reverse"`` (default), ``"forward"``, ``"difference"`` or ``"auto"`` (module docstring).
        chunk_size: most vectors per pass. ``None``: :data:`DEFAULT_CHUNK` for vmapped passes
            (memory grows linearly in the chunk); sequential reverse passes take one at a time anyway.
        progress: show a tqdm bar over batches.
        vectorize: reverse backend only: ``True`` one vmapped second backward per chunk,
            ``False`` k sequential second backwards on the retained graph, ``"auto"`` the measured
            faster one for the device (sequential on CPU, vectorized on CUDA).
        cache_graphs: reverse backend: keep every batch's gradient graph between calls (until a
            parameter or buffer changes, ``.data`` writes included, or :meth:`release_graphs`;
            checking costs one read of the model per call). Estimators switch it on themselves when
            it fits their memory budget (:meth:`configured`).
        difference_step, richardson, check_batches, difference_tolerance: the difference backend's
            step h, 4-gradient Richardson stencil, error-check batches (default: a one-row copy of
            the first batch) and the error above which ``"auto"`` refuses it (:mod:`.difference`).
        max_memory: default memory budget of the estimators run on this operator (bytes or
            ``"8GB"``; None: :func:`geometry.memory.model.default_budget` at each estimator call).
        loss_transient_bytes: bytes ``loss_fn`` allocates for a moment beyond what autograd saves,
            whatever the batch size (e.g. the chunk temporaries of the lean LM head,
            ``probes.core.lm_head.head_transient_bytes``); added to every pass of the memory model.
        data_parallel: ``True`` (the default ``torch.distributed`` group), a process group, or a
            :class:`~geometry.operators.parallel.DataParallel`: ``batches`` are this rank's share, and
            every product is over all ranks' batches (:mod:`geometry.operators.parallel`). Every rank
            must build the same operator (model, selection, dtype) and run the same estimator calls.
            ``max_memory=None`` becomes the smallest default budget over the ranks, so every rank
            makes the same memory plan.

    Cost of ``matmat`` on k vectors with B batches, in gradient-equivalents (one gradient = one
    forward + one backward of ``loss_fn``), measured on CPU: reverse ≈ B · (≈1 + ≈2.1·k) (one
    graph-building gradient with ``create_graph``, then one second backward per vector; the build
    is paid once per batch overall when graphs are cached); forward ≈ B · k · ≈4. Memory:
    :meth:`pass_bytes`. Measurements: benchmarks/README.md ("HVP throughput", "Solver steps").

    Attributes:
        space: the :class:`ParamSpace` fixing names, shapes and flat order of the parameters.
        weights: normalised batch weights (tuple of floats).
        num_matvecs: number of Hessian-vector products computed so far.
        num_graph_builds: number of per-batch gradient graphs built so far.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        batches: Sequence[Any],
        params: ParamGlobs = None,
        weights: Sequence[float] | None = None,
        backend: Backend = "reverse",
        chunk_size: int | None = None,
        progress: bool = False,
        vectorize: bool | Literal["auto"] = "auto",
        cache_graphs: bool = False,
        max_memory: int | str | None = None,
        loss_transient_bytes: int = 0,
        data_parallel: bool | Any = False,
        difference_step: float | None = None,
        richardson: bool = False,
        check_batches: Sequence[Any] | None = None,
        difference_tolerance: float = DEFAULT_TOLERANCE,
    ):
        if not isinstance(model, nn.Module):
            raise OperatorError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise OperatorError("loss_fn must be callable as loss_fn(model, batch) -> scalar tensor")
        if isinstance(batches, torch.Tensor):
            raise OperatorError("batches must be a sequence of batches (e.g. a list of [b, s] tensors), not one tensor")
        batches = list(batches)
        parallel = data_parallel is not False and data_parallel is not None
        if not batches and not parallel:  # data-parallel: an empty rank is refused on every rank, below
            raise OperatorError("the batch list is empty: the Hessian needs at least one batch")
        if backend not in BACKENDS:
            raise OperatorError(f"backend must be 'reverse', 'forward', 'difference' or 'auto', got {backend!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise OperatorError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        if vectorize not in (True, False, "auto"):
            raise OperatorError(f"vectorize must be True, False or 'auto', got {vectorize!r}")

        selected = select_parameters(model, params)
        self.space = ParamSpace.from_params(selected)
        self.model = model
        self.loss_fn = loss_fn
        self.batches = batches
        self.weights = () if parallel else normalise_batch_weights(batches, weights, OperatorError, loss_fn)
        self.backend: Backend = backend
        self.chunk_size = chunk_size
        self.progress = progress
        self.vectorize = (self.space.device.type != "cpu" or AUTO_VECTORIZE_CPU) if vectorize == "auto" else bool(vectorize)
        self.cache_graphs = bool(cache_graphs)
        self.max_memory = max_memory
        self.loss_transient_bytes = int(loss_transient_bytes)
        self.num_matvecs = 0
        self.num_graph_builds = 0
        self._graphs: dict[int, GradientGraph] = {}
        self._fingerprint: tuple | None = None
        self._graph_bytes: dict[Any, int] = {}
        self._dead_checked = False
        self.parallel: DataParallel | None = None
        if parallel:
            self.parallel = join_data_parallel(self, data_parallel, weights)
        self.difference_step, self.richardson, self.check_batches = difference_step, bool(richardson), check_batches
        self.hvp_check: dict | None = None
        self.num_gradients = 0
        self.backend_choice: dict | None = None
        if backend == "auto":
            if self.parallel is not None:  # each rank would measure its own check slice and could choose differently
                raise OperatorError("backend='auto' is not available with data_parallel: pass backend='reverse' or 'difference'")
            self.backend = choose_backend(self, difference_tolerance)

    # ------------------------------------------------------------------ attributes
    @property
    def dim(self) -> int:
        return self.space.dim

    @property
    def dtype(self) -> torch.dtype:
        """dtype of vectors in and out: the model's, promoted to at least float32."""
        return estimator_dtype(self.space.dtype)

    @property
    def param_dtype(self) -> torch.dtype:
        """dtype the products are computed in (the selected parameters')."""
        return self.space.dtype

    @property
    def device(self) -> torch.device:
        return self.space.device

    def __repr__(self) -> str:
        mode = f"vectorize={self.vectorize}" if self.backend == "reverse" else "vmap"
        return (f"HessianOperator(dim={self.dim}, params={len(self.space.names)} tensors, batches={len(self.batches)}, "
                f"backend={self.backend!r}, {mode}, chunk_size={self.chunk_size}, dtype={self.param_dtype}, "
                f"cache_graphs={self.cache_graphs})")

    # ------------------------------------------------------------------ public API
    def matvec(self, v: Mapping[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor] | torch.Tensor:
        """``H v`` for one vector: a dict ``{name: Tensor[shape]}`` or a flat ``Tensor[dim]``;
        returns the same kind. Cost: one Hessian-vector product (see the class docstring)."""
        if isinstance(v, Mapping):
            self.space.check_dict(v)
            out = self.matmat({n: t.unsqueeze(0) for n, t in v.items()})
            return {n: t[0] for n, t in out.items()}
        if isinstance(v, torch.Tensor):
            return self.matvec_flat(v)
        raise OperatorError(f"matvec takes a dict of tensors or a flat tensor, got {type(v).__name__}")

    def matmat(self, V: Mapping[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor] | torch.Tensor:
        """``H v_i`` for k vectors: a dict ``{name: Tensor[k, *shape]}`` or a flat ``Tensor[k, dim]``
        (vectors as rows); returns the same kind (in :attr:`dtype`). Cost: k Hessian-vector products."""
        if isinstance(V, Mapping):
            k = self.space.check_dict(V, batched=True)
            if k == 0:
                raise OperatorError("k = 0: pass at least one vector")
            vs = [V[n].to(device=self.device, dtype=self.dtype) for n in self.space.names]
            outs = [torch.zeros_like(t) for t in vs]
            self._accumulate(vs, outs, reduce=outs)
            self.num_matvecs += k
            return dict(zip(self.space.names, outs))
        if isinstance(V, torch.Tensor):
            return self.matmat_flat(V)
        raise OperatorError(f"matmat takes a dict of tensors or a flat [k, dim] tensor, got {type(V).__name__}")

    def gradient(self) -> tuple[float, torch.Tensor]:
        """``(L, ∇L)``: the weighted mean loss (float, the loss_fn's units) and its gradient, flat
        ``Tensor[dim]`` in :attr:`space` order and :attr:`dtype`. Cost: one gradient per batch
        (data-parallel: of this rank's batches, then one all-reduce)."""
        grad = torch.zeros(self.dim, dtype=self.dtype, device=self.device)

        def local() -> float:
            total = 0.0
            with self._call_context() as params:
                for i, (w, batch) in self._iter_batches("gradient"):
                    loss = self._loss(params, batch, i)
                    gs = torch.autograd.grad(loss, list(params.values()), allow_unused=True, materialize_grads=True)
                    for s, gi in zip(self.space.slices.values(), gs):
                        grad[s].add_(gi.reshape(-1), alpha=w)
                    total += w * float(loss.detach())
            return total

        if self.parallel is None:
            total = local()
        else:
            total = self.parallel.agree(local, "a gradient", self.device)
            self.parallel.all_reduce_(grad)
            (total,) = self.parallel.sum_floats([total], self.device)
        if not is_finite(grad):
            raise OperatorError("the gradient is NaN/Inf; check the model's weights and the batches")
        return total, grad

    # ------------------------------------------------------------------ memory and graph cache
    def graph_bytes(self, index: int) -> int:
        """Bytes of batch ``index``'s double-backward graph: the tensors autograd saves for the
        forward and the ``create_graph`` backward, plus the first-order gradients. Measured once per
        batch shape on a one-row copy (:mod:`geometry.memory.graphs`; cost: one small gradient)."""
        rows, sliced, key = one_row(self.batches[index])
        if key not in self._graph_bytes:
            def build():
                loss = self._loss(params, sliced, index)
                torch.autograd.grad(loss, list(params.values()), create_graph=True, allow_unused=True)

            with self._call_context() as params:
                self._graph_bytes[key] = saved_graph_bytes(self.model, build)
        return int(self._graph_bytes[key] * rows + self.dim * itemsize(self.param_dtype))

    def pass_bytes(self, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """Predicted peak bytes of one :meth:`matmat_flat` of ``k`` vectors beyond its input and
        output ``[k, dim]`` tensors (:func:`geometry.memory.graphs.pass_bytes`), with graphs kept
        between calls when ``cached`` (default: ``cache_graphs``)."""
        if self.backend == "difference":
            need = difference_pass_bytes(self)
        else:
            graphs = [self.graph_bytes(i) for i in range(len(self.batches))]
            grad = self.dim * itemsize(self.param_dtype)
            # half models: each float32 vector is converted to the parameters' dtype, and adding a half
            # product into a float32 output casts it a parameter at a time (the largest, per vector in flight)
            chunk, converted = chunk or self._chunk(k, True), 0
            if self.dtype != self.param_dtype:
                largest = max((math.prod(s) for s in self.space.shapes), default=0)
                converted = grad + (min(k, chunk) if self.vectorize else 1) * largest * itemsize(self.dtype)
            need = pass_bytes(graphs, grad, self.backend, self.vectorize, k, chunk,
                              self.cache_graphs if cached is None else cached, self.loss_transient_bytes + converted)
        if self.parallel is None:
            return need
        # every rank plans for the largest pass of any rank (so all make the same choices), plus the
        # all-reduce's staging copy of the [k, dim] result where the backend cannot reduce in place
        staging = k * self.dim * itemsize(self.dtype) if self.parallel._device(self.device) != self.device else 0
        return self.parallel.max_int(need + staging, self.device)

    @contextlib.contextmanager
    def configured(self, chunk_size: int | None = None, cache_graphs: bool | None = None) -> Iterator["HessianOperator"]:
        """Temporarily set ``chunk_size`` / ``cache_graphs`` (estimators do this to fit their
        budget); graphs kept for the block are released at its end."""
        old = (self.chunk_size, self.cache_graphs)
        if chunk_size is not None:
            self.chunk_size = chunk_size
        if cache_graphs is not None:
            self.cache_graphs = bool(cache_graphs) and self.backend == "reverse"
        try:
            yield self
        finally:
            if self.cache_graphs and not old[1]:
                self.release_graphs()
            self.chunk_size, self.cache_graphs = old

    def checked(self) -> dict | None:
        """The difference backend's error against the exact reverse products on the check slice,
        measured once (:func:`geometry.operators.difference.measure`); None for other backends."""
        if self.backend == "difference" and self.hvp_check is None:
            self.hvp_check = measure(self, lambda backend, batches: HessianOperator(
                self.model, self.loss_fn, batches, params=list(self.space.names), backend=backend,
                difference_step=self.difference_step, richardson=self.richardson))
        return self.hvp_check

    def release_graphs(self) -> None:
        """Free the gradient graphs kept between calls."""
        self._graphs.clear()
        self._fingerprint = None

    # ------------------------------------------------------------------ base-class hook
    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        k = V.shape[0]
        out = torch.zeros_like(V)
        # column blocks of a row-major [k, dim] tensor view as [k, *shape] without copies
        views_in = [V[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        views_out = [out[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        self._accumulate(views_in, views_out, reduce=[out])
        return out

    # ------------------------------------------------------------------ internals
    def _iter_batches(self, desc: str) -> Iterator[tuple[int, tuple[float, Any]]]:
        pairs = list(zip(self.weights, self.batches))
        items: Any = enumerate(pairs)
        if self.progress and (self.parallel is None or self.parallel.rank == 0):
            from tqdm.auto import tqdm

            items = tqdm(items, total=len(pairs), desc=desc, leave=False)
        for i, (w, batch) in items:
            if w > 0:
                yield i, (w, batch)

    def _current_params(self) -> dict[str, torch.Tensor]:
        """The selected parameters as they are in the model now (weights may have been replaced)."""
        named = dict(self.model.named_parameters())
        out = {}
        for name, shape in zip(self.space.names, self.space.shapes):
            p = named.get(name)
            if p is None or p.shape != shape or p.dtype != self.param_dtype or p.device != self.device:
                raise OperatorError(f"parameter {name!r} vanished or changed shape/dtype/device since the operator was built")
            out[name] = p
        return out

    @contextlib.contextmanager
    def _call_context(self) -> Iterator[dict[str, torch.Tensor]]:
        """Eval mode, MATH attention, true embedding derivatives, grad enabled, parameters outside
        the selection frozen (``requires_grad=False``: autograd then keeps no graph for the layers
        that lead to no selected parameter, and the Hessian is w.r.t. the selection with the rest
        constant, as defined); restores modes, ``requires_grad`` and ``.grad`` afterwards."""
        grads = [(p, p.grad) for p in self.model.parameters()]
        params = self._current_params()
        chosen = {id(t) for t in params.values()}
        frozen = [p for p in self.model.parameters() if p.requires_grad and id(p) not in chosen]
        try:
            for p in frozen:
                p.requires_grad_(False)
            attention = checkpointing_layers(self.model) if self.backend == "difference" else second_order_attention()
            with module_modes(self.model, training=False), torch.enable_grad(), attention, true_derivatives(self.model):
                yield params
        finally:
            for p in frozen:
                p.requires_grad_(True)
            for p, g in grads:
                if p.grad is not g:
                    p.grad = g

    def _loss(self, params: dict[str, torch.Tensor], batch: Any, index: int) -> torch.Tensor:
        loss = self.loss_fn(self.model, batch)
        check_loss(loss, index)
        if not loss.requires_grad:
            raise OperatorError(
                f"the loss of batch {index} has no autograd graph: it does not depend on the selected "
                "parameters, or loss_fn detaches it / runs under torch.no_grad()"
            )
        return loss

    def _chunk(self, k: int, vmapped: bool) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return DEFAULT_CHUNK if vmapped else k

    def _accumulate(self, vs: list[torch.Tensor], outs: list[torch.Tensor],
                    reduce: list[torch.Tensor] | None = None) -> None:
        """``outs[j] += Σ_b w_b (H_b V)_j`` for V given per parameter as ``vs[j]`` [k, *shape_j].
        Data-parallel: over this rank's batches, then the contiguous tensors ``reduce`` (holding
        ``outs``) are all-reduced, after every rank reported success."""
        def local() -> None:
            with self._call_context() as params:
                if self.backend == "reverse":
                    self._reverse(params, vs, outs)
                elif self.backend == "difference":
                    items = [(i, w, b) for i, (w, b) in self._iter_batches("hvp")]
                    h = self.difference_step or relative_step(self.param_dtype, self.richardson)
                    self.num_gradients += difference_products(params, items, lambda b, i: self._loss(params, b, i),
                                                              vs, outs, h, self.richardson)
                else:
                    self._forward(params, vs, outs)

        if self.parallel is None:
            local()
        else:
            self.parallel.agree(local, "a Hessian-vector product", self.device)
            for t in reduce if reduce is not None else outs:
                self.parallel.all_reduce_(t)
        for name, o in zip(self.space.names, outs):
            if not is_finite(o):
                raise OperatorError(f"the Hessian-vector product is NaN/Inf (first at parameter {name!r}); "
                                    "check the model's weights, the vectors and the loss")

    def _graph(self, params: dict[str, torch.Tensor], batch: Any, index: int) -> GradientGraph:
        """Batch ``index``'s gradient graph: from the cache when kept and still valid, else built."""
        if self.cache_graphs and index in self._graphs:  # valid: checked once per call in _reverse
            return self._graphs[index]
        tensors = list(params.values())
        graph = gradient_graph(self._loss(params, batch, index), tensors)
        self.num_graph_builds += 1
        # a gradient that does not depend on θ has a zero Hessian row: right for a loss linear in
        # that tensor, wrong when an op's backward is not differentiable -> checked once
        if len(graph.live) < len(tensors) and not self._dead_checked:
            self._dead_checked = True
            check_dead_rows(lambda: self._loss(params, batch, index), params,
                            [j for j in range(len(tensors)) if j not in graph.live])
        if self.cache_graphs:
            self._graphs[index] = graph
        return graph

    def _reverse(self, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        chunk = self._chunk(vs[0].shape[0], self.vectorize)
        if self.cache_graphs:  # kept graphs are the Hessian at the weights they were built on
            fp = model_fingerprint(self.model)  # identity, version and content of every tensor (.data writes too)
            if fp != self._fingerprint:
                self._graphs.clear()
                self._fingerprint = fp
        for i, (w, batch) in self._iter_batches("hvp"):
            graph = self._graph(params, batch, i)
            reverse_products(graph, list(params.values()), vs, outs, w, chunk, self.vectorize, self.param_dtype)
            del graph  # not cached: this batch's graph is freed before the next batch

    def _forward(self, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        k = vs[0].shape[0]
        for i, (w, batch) in self._iter_batches("hvp"):
            forward_over_reverse(self.model, self.loss_fn, params, batch, vs, outs, w, self._chunk(k, True),
                                 self.param_dtype, lambda loss: check_loss(loss, i, finite=False), i)


#: Measured choice for ``vectorize="auto"`` on CPU (benchmarks/README.md, "HVP throughput").
AUTO_VECTORIZE_CPU = False

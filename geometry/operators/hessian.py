"""Hessian-vector products of a model's loss, batched over k vectors (docs/science.md §4).

:class:`HessianOperator` is the Hessian ``H = ∇²_θ L(θ)`` of the weighted mean loss

    L(θ) = Σ_b w_b · loss_fn(model, batch_b),      Σ_b w_b = 1,

with respect to a declared parameter set θ (globs over parameter names), applied to blocks of k
vectors without ever forming H. A product backend computes them (:mod:`losslens.geometry.operators.backend`):
``"reverse"`` (default, reverse-over-reverse, :mod:`~losslens.geometry.operators.reverse`), ``"forward"``
(forward-over-reverse, :mod:`~losslens.geometry.operators.forward`), ``"difference"`` (gradient differences,
first order only, its error measured: :mod:`~losslens.geometry.operators.difference`); ``"auto"`` picks
the exact one when it fits ``max_memory``, else the measured difference one
(:mod:`~losslens.geometry.operators.auto`; why: ``backend_choice``). A backend's own settings are
given on its object (``ReverseBackend(vectorize=..., cache_graphs=...)``,
``DifferenceBackend(step=..., richardson=..., check_batches=..., tolerance=...)``); the reverse
backend also keeps the operator's gradient graphs between calls.

Precision: products run in ``compute_dtype``, float32 by default for a float16/bfloat16 model
(weights upcast for each call, the stored half weights untouched: :mod:`losslens.geometry.operators.precision`),
the model's dtype otherwise; ``compute_dtype="bfloat16"`` keeps half arithmetic as an explicit
choice. Vectors in and out of :meth:`matmat_flat` and all accumulation over batches are in
:attr:`HessianOperator.dtype` (float32 at least), so estimator linear algebra never runs in half precision.

Memory: :meth:`HessianOperator.pass_bytes` predicts the peak of one product of k vectors beyond the vectors
themselves, from the double-backward graph of the largest batch measured once (saved-tensor
hooks on one row of each batch shape): see :mod:`losslens.geometry.memory.model` and benchmarks/README.md
("Scale") for the check against measured peaks.

Conventions, side effects and guarantees of every call: :mod:`losslens.geometry.operators.call` (eval mode,
MATH attention for exact backends, true embedding derivatives, ``.grad`` / ``requires_grad`` /
modes restored, parameters outside the selection frozen for the call); a selected parameter whose
gradient has no graph (a zero Hessian row) is checked once with a finite difference of gradients
(:func:`~losslens.geometry.operators.derivatives.check_dead_rows`); with ``data_parallel`` each rank passes its
share of the batches and products, gradients and memory plans are those of all ranks' batches
together (:mod:`losslens.geometry.operators.data_parallel`).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import nn

from losslens.geometry.base.batches import normalise_batch_weights
from losslens.geometry.base.params import ParamGlobs, ParamSpace, select_parameters
from losslens.geometry.operators.auto import AutoBackend
from losslens.geometry.operators.backend import ProductBackend
from losslens.geometry.operators.names import DEFAULT_BACKEND, backend_named
from losslens.geometry.operators.precision import cast_inputs, compute_copy_bytes, compute_dtype_for
from losslens.geometry.operators.param_dicts import ParamDictProducts
from losslens.geometry.operators.data_parallel import DataParallel, join_data_parallel
from losslens.geometry.operators.call import batch_items, product_call
from losslens.geometry.operators.difference import DEFAULT_TOLERANCE
from losslens.geometry.operators.first_order import loss_and_gradient
from losslens.geometry.operators.guarantees import before_products, warn_product_error
from losslens.geometry.operators.interface import CurvatureOperator, OperatorError, estimator_dtype, is_finite
from losslens.geometry.operators.reverse import ReverseBackend, check_loss, graph_bytes

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Backend = str  # a name of losslens.geometry.operators.names.BACKEND_NAMES

#: Default bound on k per pass for the vmapped passes (vectorized reverse, forward). A vmapped
#: pass holds ~k copies of the backward's intermediates, so memory grows linearly with the chunk.
DEFAULT_CHUNK = 16


class HessianOperator(ParamDictProducts, CurvatureOperator):
    """Hessian of ``Σ_b w_b loss_fn(model, batch_b)`` w.r.t. selected parameters, as an operator.

    Args:
        model: any ``nn.Module``; read live at each call (weights copied into it later are used).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` (mean loss of the batch), e.g.
            :func:`losslens.lm.core.next_token_loss.lm_loss`.
        batches: non-empty sequence of batches (anything ``loss_fn`` accepts).
        params: ``None`` (every parameter with ``requires_grad``), a glob or a list of globs over
            parameter names (:func:`losslens.geometry.base.params.select_parameters`).
        weights: one non-negative weight per batch, normalised to sum 1; default
            :func:`~losslens.geometry.base.batches.default_batch_weight` (``loss_fn.batch_weight``: tokens; else rows).
        backend: ``"reverse"`` (default), ``"forward"``, ``"difference"`` or ``"auto"`` with their
            default settings (module docstring), or a configured backend object
            (:mod:`losslens.geometry.operators.backend`): ``ReverseBackend(vectorize=True, cache_graphs=True)``
            (:class:`~losslens.geometry.operators.reverse.ReverseBackend`: vmapped second backwards,
            graphs kept between calls), ``DifferenceBackend(step=h, richardson=True, check_batches=[...],
            tolerance=1e-2)`` (:class:`~losslens.geometry.operators.difference.DifferenceBackend`),
            ``AutoBackend(DifferenceBackend(...), ReverseBackend(...))``. The operator keeps its own
            copy (:meth:`~losslens.geometry.operators.backend.ProductBackend.for_operator`).
        chunk_size: most vectors per pass. ``None``: :data:`DEFAULT_CHUNK` for vmapped passes
            (memory grows linearly in the chunk); sequential reverse passes take one at a time anyway.
        progress: show a tqdm bar over batches.
        compute_dtype: the dtype the products run in (:mod:`losslens.geometry.operators.precision`): None
            (default) float32 for float16/bfloat16 weights, the weights' dtype otherwise; a dtype
            or ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"``. The weights stay stored
            in their dtype; a different compute dtype runs on copies made for each call.
        max_memory: default memory budget of the estimators run on this operator (bytes or
            ``"8GB"``; None: :func:`losslens.geometry.memory.budget.default_budget` at each estimator call).
        loss_transient_bytes: bytes ``loss_fn`` allocates for a moment beyond what autograd saves,
            whatever the batch size (e.g. the chunk temporaries of the lean LM head,
            ``losslens.lm.core.lm_head.head_transient_bytes``); added to every pass of the memory model.
        data_parallel: ``True`` (the default ``torch.distributed`` group), a process group, or a
            :class:`~losslens.geometry.operators.data_parallel.DataParallel`: ``batches`` are this rank's share, and
            every product is over all ranks' batches (:mod:`losslens.geometry.operators.data_parallel`). Every rank
            must build the same operator (model, selection, dtype) and run the same estimator calls.
            ``max_memory=None`` becomes the smallest default budget over the ranks, so every rank
            makes the same memory plan.

    Cost of ``matmat`` on k vectors with B batches, in gradient-equivalents (one gradient = one
    forward + one backward of ``loss_fn``), measured on CPU: reverse ≈ B · (≈1 + ≈2.1·k) (one
    graph-building gradient with ``create_graph``, then one second backward per vector; the build
    is paid once per batch overall when graphs are cached); forward ≈ B · k · ≈4. Memory:
    :meth:`pass_bytes`. Measurements: benchmarks/README.md ("HVP throughput", "Solver steps").

    Never silent (:mod:`~losslens.geometry.operators.guarantees`): an inexact backend's error is measured before
    the first product; over ``error_tolerance`` it warns once (``ProductErrorWarning``); so do zero-embedding tokens.

    Attributes:
        space: the :class:`ParamSpace` fixing names, shapes and flat order of the parameters.
        error_tolerance: measured relative product error above which the operator warns (the
            difference backend's ``tolerance``; :func:`losslens.lm.models.curvature.lm_hessian` sets the CLI's).
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
        backend: Backend | ProductBackend | AutoBackend = DEFAULT_BACKEND,
        chunk_size: int | None = None,
        progress: bool = False,
        max_memory: int | str | None = None,
        loss_transient_bytes: int = 0,
        data_parallel: bool | Any = False,
        compute_dtype: torch.dtype | str | None = None,
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
        chosen = backend_named(backend)
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise OperatorError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")

        selected = select_parameters(model, params)
        self.space = ParamSpace.from_params(selected)
        self.compute_dtype = compute_dtype_for(self.space.dtype, compute_dtype)
        self.model = model
        self.loss_fn = loss_fn
        self.batches = batches
        self.weights = () if parallel else normalise_batch_weights(batches, weights, OperatorError, loss_fn)
        # "auto" prices the exact pass on its reverse backend before it chooses (below)
        self.product_backend: ProductBackend = (
            chosen.reverse if isinstance(chosen, AutoBackend) else chosen
        ).for_operator()
        self.chunk_size = chunk_size
        self.progress = progress
        self.max_memory = max_memory
        self.loss_transient_bytes = int(loss_transient_bytes)
        self.num_matvecs = 0
        self.num_graph_builds = 0
        #: measured bytes per batch shape: double-backward graphs and first-order gradient passes
        self.measured_passes: dict[Any, Any] = {}
        self.parallel: DataParallel | None = None
        if parallel:
            self.parallel = join_data_parallel(self, data_parallel, weights)
        self.hvp_check: dict | None = None
        self.error_tolerance = float(getattr(chosen, "tolerance", DEFAULT_TOLERANCE))
        self.verify_products = True  # False: the caller measures the error (the error check's own operators)
        self.num_gradients = 0
        self.backend_choice: dict | None = None
        if isinstance(chosen, AutoBackend):
            if self.parallel is not None:  # each rank would measure its own check slice and could choose differently
                raise OperatorError(
                    f"backend={chosen.name!r} is not available with data_parallel: pass "
                    f"backend={ReverseBackend.name!r} or {chosen.difference.name!r}"
                )
            self.product_backend, self.backend_choice, self.hvp_check = chosen.choose(self)

    # ------------------------------------------------------------------ attributes
    @property
    def dim(self) -> int:
        return self.space.dim

    @property
    def backend(self) -> str:
        """The product backend's name (``"reverse"``, ``"forward"`` or ``"difference"``), as results record it."""
        return self.product_backend.name

    @property
    def check_batches(self) -> Sequence[Any] | None:
        """The batches of the backend's error check (the difference backend's; None otherwise)."""
        return getattr(self.product_backend, "check_batches", None)

    @property
    def can_keep_graphs(self) -> bool:
        """Whether gradient graphs can be kept between calls: the backend keeps graphs and the products
        run in the stored dtype (a compute copy gets new gradient accumulators each call:
        :mod:`losslens.geometry.operators.precision`)."""
        return self.product_backend.keeps_graphs and self.compute_dtype == self.space.dtype

    @property
    def cache_graphs(self) -> bool:
        """Whether gradient graphs are kept between calls: the backend's ``cache_graphs`` (reverse), where
        :attr:`can_keep_graphs`."""
        return bool(getattr(self.product_backend, "cache_graphs", False)) and self.can_keep_graphs

    @property
    def kept_graphs(self) -> int:
        """Number of gradient graphs kept between calls now."""
        return self.product_backend.kept_graphs

    @property
    def dtype(self) -> torch.dtype:
        """dtype of vectors in and out: the compute dtype, promoted to at least float32."""
        return estimator_dtype(self.compute_dtype)

    @property
    def param_dtype(self) -> torch.dtype:
        """dtype the products are computed in (``compute_dtype``)."""
        return self.compute_dtype

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype the selected parameters are stored in (the model's)."""
        return self.space.dtype

    @property
    def device(self) -> torch.device:
        return self.space.device

    def __repr__(self) -> str:
        return (
            f"HessianOperator(dim={self.dim}, params={len(self.space.names)} tensors, batches={len(self.batches)}, "
            f"backend={self.product_backend!r}, chunk_size={self.chunk_size}, dtype={self.param_dtype})"
        )

    # ------------------------------------------------------------------ public API
    def gradient(self) -> tuple[float, torch.Tensor]:
        """``(L, ∇L)``: the weighted mean loss (float, the loss_fn's units) and its gradient, flat
        ``Tensor[dim]`` in :attr:`space` order and :attr:`dtype`. Cost: one gradient per batch
        (data-parallel: of this rank's batches, then one all-reduce)."""
        return loss_and_gradient(self)

    # ------------------------------------------------------------------ memory and graph cache
    def graph_bytes(self, index: int) -> int:
        """Bytes of batch ``index``'s double-backward graph: the tensors autograd saves for the
        forward and the ``create_graph`` backward, plus the first-order gradients. Measured once per
        batch shape on a one-row copy (:mod:`losslens.geometry.memory.graphs`; cost: one small gradient)."""
        return graph_bytes(self, index)

    def pass_bytes(self, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """Predicted peak bytes of one :meth:`matmat_flat` of ``k`` vectors beyond its input and
        output ``[k, dim]`` tensors (:func:`losslens.geometry.memory.graphs.pass_bytes`), with graphs kept
        between calls when ``cached`` (default: ``cache_graphs``)."""
        need = self.product_backend.pass_bytes(self, k, cached, chunk)
        need += compute_copy_bytes(self.model, self.compute_dtype)  # the compute-dtype copy of the weights
        return (
            need
            if self.parallel is None
            else self.parallel.planned_pass_bytes(need, k, self.dim, self.dtype, self.device)
        )

    def _configure(self, chunk_size: int | None, cache_graphs: bool | None) -> Callable[[], None]:
        """``chunk_size`` / the backend's ``cache_graphs`` for an estimator's block (a backend that keeps
        no graphs ignores it; :meth:`~losslens.geometry.operators.interface.CurvatureOperator.configured`);
        the restore releases the graphs kept for the block."""
        backend = self.product_backend
        old = (self.chunk_size, self.cache_graphs, getattr(backend, "cache_graphs", None))
        if chunk_size is not None:
            self.chunk_size = chunk_size
        if cache_graphs is not None and backend.keeps_graphs:
            backend.cache_graphs = bool(cache_graphs)

        def restore() -> None:
            if self.cache_graphs and not old[1]:
                self.release_graphs()
            self.chunk_size = old[0]
            if backend.keeps_graphs:
                backend.cache_graphs = old[2]

        return restore

    def checked(self) -> dict | None:
        """The backend's measured error against an exact reference, measured once
        (:meth:`~losslens.geometry.operators.backend.ProductBackend.check`); None for exact backends."""
        if self.hvp_check is None:
            self.hvp_check = self.product_backend.check(self)
        warn_product_error(self)  # a ProductErrorWarning, once, when over error_tolerance
        return self.hvp_check

    def sibling(self, batches: Sequence[Any], backend: Any) -> "HessianOperator":
        """An operator of the same model, loss and parameter selection on other ``batches`` with
        ``backend`` (a name or object): the error checks' operators (default budget, no transients;
        ``verify_products`` off: their error is what the check measures)."""
        op = HessianOperator(
            self.model,
            self.loss_fn,
            batches,
            params=list(self.space.names),
            backend=backend,
            compute_dtype=self.compute_dtype,
        )
        op.verify_products = False
        return op

    def release_graphs(self) -> None:
        """Free the gradient graphs kept between calls (the backend's)."""
        self.product_backend.release_graphs()

    @property
    def refines(self) -> bool:
        """An inexact backend's products may be refined (:meth:`_refined_matmat_flat`)."""
        return not self.product_backend.exact

    # ------------------------------------------------------------------ base-class hooks
    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        return self._products(V, self.product_backend)

    def _refined_matmat_flat(self, V: torch.Tensor) -> torch.Tensor | None:
        """The products of the backend's ``refined(self)`` (difference: Richardson's stencil), or None."""
        refined = self.product_backend.refined(self)
        return None if refined is None else self._products(V, refined)

    def _products(self, V: torch.Tensor, backend: ProductBackend) -> torch.Tensor:
        k = V.shape[0]
        out = torch.zeros_like(V)
        # column blocks of a row-major [k, dim] tensor view as [k, *shape] without copies
        views_in = [V[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        views_out = [out[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        self._accumulate(views_in, views_out, reduce=[out], backend=backend)
        return out

    # ------------------------------------------------------------------ internals
    def batch_items(self, desc: str) -> Iterator[tuple[int, tuple[float, Any]]]:
        """:func:`~losslens.geometry.operators.call.batch_items` of this operator."""
        return batch_items(self, desc)

    def call_context(self, backend: ProductBackend | None = None) -> ContextManager[dict[str, torch.Tensor]]:
        """:func:`~losslens.geometry.operators.call.product_call` of this operator (yields the selected
        parameters) with ``backend``'s attention (default: this operator's backend)."""
        return product_call(
            self.model, self.space, (backend or self.product_backend).attention(self.model), self.compute_dtype
        )

    def batch_loss(self, params: dict[str, torch.Tensor], batch: Any, index: int, graph: bool = True) -> torch.Tensor:
        """``loss_fn(model, batch)`` of batch ``index``, checked: a finite scalar, with a graph
        unless ``graph`` is False (a forward under ``torch.no_grad()``)."""
        loss = self.loss_fn(self.model, cast_inputs(batch, self.compute_dtype))
        check_loss(loss, index)
        if graph and not loss.requires_grad:
            raise OperatorError(
                f"the loss of batch {index} has no autograd graph: it does not depend on the selected "
                "parameters, or loss_fn detaches it / runs under torch.no_grad()"
            )
        return loss

    def chunk_for(self, k: int, vmapped: bool) -> int:
        """Vectors per pass: ``chunk_size``, else :data:`DEFAULT_CHUNK` vmapped and all k otherwise."""
        if self.chunk_size is not None:
            return self.chunk_size
        return DEFAULT_CHUNK if vmapped else k

    def _accumulate(
        self, vs: list, outs: list, reduce: list | None = None, backend: ProductBackend | None = None
    ) -> None:
        """``outs[j] += Σ_b w_b (H_b V)_j`` for V per parameter as ``vs[j]`` ``[k, *shape_j]``, ``backend``'s products
        (default this operator's). Data-parallel: over this rank's batches, then the contiguous tensors
        ``reduce`` (holding ``outs``) are all-reduced, after every rank reported success."""
        backend = backend or self.product_backend

        def local() -> None:
            before_products(self)  # the zero-embedding check and an inexact backend's error, once
            with self.call_context(backend) as params:
                backend.products(self, params, vs, outs)

        if self.parallel is None:
            local()
        else:
            self.parallel.agree(local, "a Hessian-vector product", self.device)
            for t in reduce if reduce is not None else outs:
                self.parallel.all_reduce_(t)
        for name, o in zip(self.space.names, outs):
            if not is_finite(o):
                raise OperatorError(
                    f"the Hessian-vector product is NaN/Inf (first at parameter {name!r}); "
                    "check the model's weights, the vectors and the loss"
                )

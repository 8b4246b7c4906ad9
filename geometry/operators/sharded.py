"""Hessian-vector products of an FSDP2-sharded model, by gradient differences (docs/science.md §4).

:class:`ShardedHessianOperator` is the Hessian of the weighted mean loss over every rank's batches,

    L(θ) = Σ_r Σ_{b ∈ rank r} w_b · loss_fn(model, b),      Σ_all w_b = 1,

for a model whose parameters were sharded with ``torch.distributed.fsdp.fully_shard`` (FSDP2:
``DTensor`` parameters, ``Shard(0)``). Nothing is ever gathered whole: every vector, the estimators'
state and the master copy of θ hold this rank's shards only (1/N of the elements).

The product is the gradient-difference backend (:mod:`losslens.geometry.operators.difference`), its loop
for shards in :mod:`losslens.geometry.operators.sharded_products`: the local shards are set to
``θ_master ± ε·v`` in place, every rank runs ``loss.backward()`` on its own batch, FSDP2 all-gathers
the layers for the forward and reduce-scatters each unit's gradient, which a hook adds straight into
the output vector (no ``.grad`` shards are kept); the master copy of θ is kept in the narrowest dtype
that holds it exactly (bfloat16 for a float32 cast of a bfloat16 checkpoint). The step ε follows the
same rule as the unsharded backend with *global* ‖θ‖, ‖v‖₂, ‖v‖₄ and n (all-reduced), so the sharded
product equals the unsharded difference product up to the order of floating-point summation.

Batches and weights. FSDP2 averages gradients uniformly over the ranks, while the operator weights
batches by their loss terms (``loss_fn.batch_weight``, e.g. the predicted tokens of ``lm_loss``; rows
for a loss without it: :mod:`losslens.geometry.base.batches`): each rank scales its loss by ``w_b · N``,
so the reduce-scatter's mean is ``Σ_r Σ_b w_b ∇L_b`` whatever the split. Every backward is a collective, so the ranks
run the same number of rounds: a rank with fewer batches runs zero-weighted passes of its first batch
(the cost of an uneven split).

Vectors. Rows are ``[k, dim]`` with ``dim`` the largest local shard size over the ranks (the same on
every rank, so every memory plan and decision agrees); columns past this rank's shard are zero.
:attr:`layout` (``losslens.geometry.base._linalg.ShardLayout``) tells the estimators' linear algebra
where the columns sit in the global vector: inner products, norms and Gram matrices are summed
over the ranks, random probes are this rank's columns of the global stream. Estimators that support
sharded operators (Hutchinson, Hutch++, power iteration, Lanczos) run unchanged; the others refuse
in one line.

Memory per rank (:meth:`pass_bytes`, issue #48): the master copy of the local shards (in its narrowest
exact dtype, plus one cast of the largest local tensor to the vectors' dtype), and one sharded
gradient pass of the largest batch measured once at one and two rows with the gradients going
where the products put them (the all-gathered parameters of the live FSDP units, activations, one
unit's reduce-scatter output), extrapolated linearly in the rows. Solver state that does not fit
(a Lanczos basis, a Hutch++ sketch) goes to host RAM or local disk (``basis_device``), planned by the
memory model. Cost per product: (2 or 4 with Richardson) × rounds gradients.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from losslens.geometry.base._linalg import ShardLayout
from losslens.geometry.base.batches import raw_batch_weights
from losslens.geometry.base.modes import module_modes
from losslens.geometry.memory.graphs import first_rows, one_row, peak_new_bytes
from losslens.geometry.operators.backend import ReducedVectors
from losslens.geometry.operators.derivatives import true_derivatives
from losslens.geometry.operators.branches import FrozenBranches
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.guarantees import warn_product_error
from losslens.geometry.operators.interface import CurvatureOperator, OperatorError, estimator_dtype, is_finite
from losslens.geometry.operators.precision import compute_dtype_for
from losslens.geometry.operators.sharded_products import master_bytes, master_dtypes, sharded_difference_products
from losslens.geometry.operators.data_parallel import DataParallel, global_batch_weights

LossFn = Callable[[nn.Module, Any], torch.Tensor]


def sharded_parameters(model: nn.Module) -> dict[str, Any]:
    """The trainable FSDP2 ``DTensor`` parameters of ``model`` (``Shard(0)`` on a 1-D mesh), in order.
    Raises :class:`OperatorError` naming what to do when the model is not sharded that way."""
    from torch.distributed.tensor import DTensor, Shard

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise OperatorError("the model has no parameter with requires_grad=True")
    plain = [n for n, p in params.items() if not isinstance(p, DTensor)]
    if plain:
        raise OperatorError(
            f"{len(plain)} parameter(s) are not sharded (e.g. {plain[0]!r}): call "
            "torch.distributed.fsdp.fully_shard on the model's blocks and on the model itself first"
        )
    for n, p in params.items():
        if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
            raise OperatorError(
                f"parameter {n!r} is placed as {tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh; "
                "only FSDP2's Shard(0) on a 1-D mesh is supported (no HSDP, no tensor parallelism)"
            )
    return params


class ShardedHessianOperator(CurvatureOperator):
    """Hessian of ``Σ_b w_b loss_fn(model, b)`` over all ranks' batches, for an FSDP2 model.

    Args:
        model: a module whose trainable parameters are FSDP2 ``DTensor`` s (``fully_shard``).
        loss_fn: ``loss_fn(model, batch) -> scalar`` mean loss of the batch.
        batches: this rank's curvature batches (at least one per rank).
        weights: this rank's raw batch weights (default: ``loss_fn.batch_weight`` of each batch when the
            loss carries it, else its rows), normalised over all ranks.
        max_memory: default budget of the estimators (bytes or ``"8GB"``; None: the smallest default
            budget over the ranks).
        difference_step: the relative step h (default :func:`~losslens.geometry.operators.difference.relative_step`
            of the parameters' dtype); ``richardson``: 4 gradients per product, O(ε⁴).
        progress: unused (kept for symmetry with HessianOperator); only rank 0 would print.
        compute_dtype: the dtype the products run in; it must be the dtype the model was sharded in
            (FSDP2's shards cannot be upcast in place): None accepts float32/float64 shards and
            refuses half-precision ones (shard a float32 copy:
            ``losslens.lm.models.sharding.shard_model(model, compute_dtype=torch.float32)``, or pass
            ``compute_dtype="bfloat16"`` to keep half arithmetic, its error measured elsewhere).
        master_device: ``"cpu"`` keeps the copy of θ that restores it in host RAM (pinned on a GPU),
            not on the device: its bytes leave :meth:`pass_bytes`; each perturbation moves it in.

    Attributes: ``dim`` (padded local length, the same on every rank), ``local_dim`` (this rank's
    elements), ``global_dim``, ``layout``, ``parallel`` (the mesh's group), ``rounds``.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        batches: Sequence[Any],
        weights: Sequence[float] | None = None,
        max_memory: int | str | None = None,
        difference_step: float | None = None,
        richardson: bool = False,
        progress: bool = False,
        compute_dtype: Any = None,
        master_device: Any = None,
    ):
        if not isinstance(model, nn.Module):
            raise OperatorError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise OperatorError("loss_fn must be callable as loss_fn(model, batch) -> scalar tensor")
        self.model, self.loss_fn, self.batches = model, loss_fn, list(batches)
        self.params = sharded_parameters(model)
        first = next(iter(self.params.values()))
        self.parallel = DataParallel(first.device_mesh.get_group())
        self.names = tuple(self.params)
        self.locals = [p.to_local() for p in self.params.values()]
        self._param_dtype = self.locals[0].dtype
        if any(t.dtype != self._param_dtype for t in self.locals):
            raise OperatorError("the sharded parameters have mixed dtypes; load the model in one dtype")
        self._device = self.locals[0].device
        wanted = compute_dtype_for(self._param_dtype, compute_dtype)
        if wanted != self._param_dtype:
            stored, wanted = (str(d).replace("torch.", "") for d in (self._param_dtype, wanted))
            raise OperatorError(
                f"the model was sharded in {stored} but the products should run in {wanted}: shard a "
                "copy cast to it first (losslens.lm.models.sharding.shard_model(model, compute_dtype=...)), "
                f"or pass compute_dtype={stored!r} to keep that arithmetic"
            )
        self.local_dim = sum(t.numel() for t in self.locals)
        self.global_dim = sum(p.numel() for p in self.params.values())
        self.parallel.check_same(
            {"names": list(self.names), "dtype": str(self._param_dtype), "global_dim": self.global_dim},
            "the sharded Hessian operator",
        )
        self.layout = self._layout()
        self._dim = self.parallel.max_int(self.local_dim, self._device)
        raw = self.parallel.agree(
            lambda: raw_batch_weights(self.batches, weights, OperatorError, loss_fn),
            "checking the batch weights",
            self._device,
        )
        self.weights = global_batch_weights(self.parallel, self.batches, raw, self._device)
        self.rounds = self.parallel.max_int(len(self.batches), self._device)
        self.max_memory = max_memory
        if max_memory is None:
            from losslens.geometry.memory.budget import default_budget

            self.max_memory = self.parallel.min_int(default_budget(self._device), self._device)
        self.product_backend = DifferenceBackend(difference_step, richardson)
        self.progress = progress
        self.master_device = master_device
        self._master_on_host = master_device is not None and torch.device(master_device) != self._device
        self.num_matvecs = 0
        self.num_gradients = 0
        self.backend_choice, self.hvp_check = None, None
        self._pass_fit: tuple[float, float] | None = None

    # ------------------------------------------------------------------ attributes
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def backend(self) -> str:
        """The product backend's name (always the difference backend), as results record it."""
        return self.product_backend.name

    @property
    def richardson(self) -> bool:
        return self.product_backend.richardson

    #: the difference backend's products may be refined (:meth:`_refined_matmat_flat`)
    refines = True

    @property
    def dtype(self) -> torch.dtype:
        return estimator_dtype(self._param_dtype)

    @property
    def param_dtype(self) -> torch.dtype:
        return self._param_dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        return (
            f"ShardedHessianOperator(global_dim={self.global_dim}, local_dim={self.local_dim}, "
            f"ranks={self.parallel.world_size}, batches={len(self.batches)}, dtype={self._param_dtype})"
        )

    def _layout(self) -> ShardLayout:
        """Global positions of this rank's columns: each parameter's global offset plus the rows
        held by the lower ranks (gathered, so any FSDP2 row split is read, not assumed)."""
        rows = [t.shape[0] if t.ndim else t.numel() for t in self.locals]
        every = self.parallel.gather_objects(rows)
        ranges, offset = [], 0
        for j, (p, t) in enumerate(zip(self.params.values(), self.locals)):
            row_numel = math.prod(p.shape[1:]) if p.ndim > 1 else 1
            before = sum(every[r][j] for r in range(self.parallel.rank))
            if t.numel():
                ranges.append((offset + before * row_numel, t.numel()))
            offset += p.numel()
        parallel = self.parallel
        return ShardLayout(tuple(ranges), offset, lambda x: parallel.all_reduce_(x.contiguous()))

    # ------------------------------------------------------------------ products
    def _views(self, V: torch.Tensor) -> list[torch.Tensor]:
        k, out, start = V.shape[0], [], 0
        for t in self.locals:
            out.append(V[:, start : start + t.numel()].view(k, *t.shape))
            start += t.numel()
        return out

    @contextlib.contextmanager
    def _call_context(self, backend: DifferenceBackend | None = None) -> Iterator[None]:
        """Eval mode (checkpointed layers flagged for HF by ``backend``, default this operator's), grad
        on, true embedding derivatives (``padding_idx`` cleared:
        :func:`~losslens.geometry.operators.derivatives.true_derivatives`); the caller's ``.grad``
        restored after."""
        grads = [(p, p.grad) for p in self.params.values()]
        try:
            with (
                module_modes(self.model, training=False),
                (backend or self.product_backend).attention(self.model),  # checkpointed layers flagged, xIELU
                torch.enable_grad(),
                true_derivatives(self.model),
            ):
                yield
        finally:
            for p, g in grads:
                p.grad = g

    def _round(self, i: int) -> tuple[float, Any]:
        """This rank's (weight × world size, batch) of round i: a zero-weighted pass of its first
        batch once its own batches are done (every backward is a collective)."""
        if i < len(self.batches):
            return self.weights[i] * self.parallel.world_size, self.batches[i]
        return 0.0, self.batches[0]

    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        return self._products(V, self.product_backend)

    def _refined_matmat_flat(self, V: torch.Tensor) -> torch.Tensor | None:
        """Richardson's products at half the central step (``DifferenceBackend.refined``), or None."""
        refined = self.product_backend.refined(self)
        return None if refined is None else self._products(V, refined)

    def _products(self, V: torch.Tensor, backend: DifferenceBackend) -> torch.Tensor:
        out = torch.zeros_like(V)
        vs, outs = self._views(V), self._views(out)
        space = ReducedVectors(lambda values: self.parallel.sum_floats(values, self._device), self.global_dim)
        rounds = [(i, i) for i in range(self.rounds)]  # the weight is folded into the loss: FSDP2 averages

        def loss_of(_batch: Any, i: int) -> torch.Tensor:
            scale, batch = self._round(i)
            loss = self.loss_fn(self.model, batch)
            if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
                raise OperatorError("loss_fn must return a scalar (0-dim) mean loss")
            return loss * scale

        def local() -> None:
            branches = FrozenBranches(self.model)
            with self._call_context(backend), branches.active():
                replay = branches.record_all([(i, 1.0, b) for i, b in rounds], loss_of)  # branches at θ
                if replay is not None:
                    _reshard(self.model)  # a forward without backward leaves the root's gathered θ in place
                self.num_gradients += sharded_difference_products(
                    list(self.params.values()),
                    self.locals,
                    rounds,
                    loss_of,
                    vs,
                    outs,
                    backend.step(self),
                    backend.richardson,
                    space,
                    replay=replay,
                    master_device=self.master_device,
                )

        # a rank that raises mid-product would leave the others in a collective: the backward passes
        # are collectives themselves, so a failure here is reported by the process group's timeout
        # if not by the exception; the agreement catches every failure that happens between them
        self.parallel.agree(local, "a sharded Hessian-vector product", self._device)
        if not is_finite(out):
            raise OperatorError("the sharded Hessian-vector product is NaN/Inf; check the model's weights and the loss")
        return out

    def checked(self) -> dict:
        """``hvp_check`` when set; else: the product's error is not measured on a sharded model (the exact products
        would need the whole model on one rank): measure it with ``backend="difference"`` in one process on the
        same checkpoint, or on a miniature (:func:`losslens.lm.models.miniature.miniature_bound`)."""
        if self.hvp_check is not None:  # measured elsewhere (e.g. on the unsharded architecture)
            warn_product_error(self)  # a ProductErrorWarning, once, over error_tolerance
            return self.hvp_check
        return {
            "backend": self.backend,
            "step": self.product_backend.step(self),
            "richardson": self.richardson,
            "rel_error": None,
            "reference": "not measured on a sharded model: run --backend difference in one process to measure it",
        }

    # ------------------------------------------------------------------ memory
    def _measure_pass(self, rows: int) -> int:
        batch = self.batches[0]
        sliced = first_rows(batch, min(rows, one_row(batch)[0]))
        sliced = batch if sliced is None else sliced  # not row-shaped: measured whole

        def run() -> None:
            with self._call_context():
                handles = [p.register_post_accumulate_grad_hook(_drop_grad) for p in self.params.values()]
                try:
                    for p in self.params.values():
                        p.grad = None
                    self.loss_fn(self.model, sliced).backward()  # gradients dropped as the products add them
                finally:
                    for handle in handles:
                        handle.remove()
                    for p in self.params.values():
                        p.grad = None

        _, peak = peak_new_bytes(run)
        return self.parallel.max_int(int(peak), self._device)

    def pass_bytes(self, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """Predicted peak bytes of one product on this rank beyond its ``[k, dim]`` input and output:
        the master copy of the local shards in its narrowest exact dtype, plus the larger of one cast
        of the largest local tensor to the vectors' dtype when that is narrower (freed before the pass:
        :func:`~losslens.geometry.operators.sharded_products.master_bytes`) and one sharded gradient
        pass of the largest batch (measured at one and two rows of the first batch, gradients
        dropped as they are reduce-scattered: all-gathered units, activations, one unit's
        reduce-scatter output; extrapolated in the rows), the same over every rank (collective:
        every rank calls it). Cost, once: 3 small gradients; per call one cast-and-compare of θ.
        """
        if self._pass_fit is None:
            self._measure_pass(1)  # the first pass allocates FSDP's lasting buffers: not part of a product
            one, two = self._measure_pass(1), self._measure_pass(2)
            self._pass_fit = (float(2 * one - two), float(max(0, two - one)))
        fixed, per_row = self._pass_fit
        rows = max(one_row(b)[0] for b in self.batches)
        kept, cast = master_bytes(self.locals, master_dtypes(self.locals), self.dtype, self._master_on_host)
        need = int(kept + max(cast, max(fixed, 0.0) + per_row * rows))  # the cast is freed before the pass
        return self.parallel.max_int(need, self._device)


__all__ = ["ShardedHessianOperator", "sharded_parameters"]


def _drop_grad(p: Any) -> None:
    """A post-accumulate-grad hook: the gradient is not kept (as the products consume it)."""
    p.grad = None


def _reshard(model: nn.Module) -> None:
    """Free every FSDP2 module's gathered parameters (``FSDPModule.reshard``): after a forward with
    no backward the root keeps them (``reshard_after_forward`` is off for the root), and the next
    forward would reuse them instead of gathering the shards that were perturbed since."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

"""Hessian-vector products of a model's loss, batched over k vectors (SCIENCE.md §4).

:class:`HessianOperator` is the Hessian ``H = ∇²_θ L(θ)`` of the weighted mean loss

    L(θ) = Σ_b w_b · loss_fn(model, batch_b),      Σ_b w_b = 1,

with respect to a declared parameter set θ (globs over parameter names), applied to blocks of k
vectors without ever forming H. Two backends compute exactly the same products:

``"reverse"`` (default), reverse-over-reverse
    Per data batch the gradient ``g = ∇L_b`` is built once with ``create_graph=True`` and that graph
    is reused for all k vectors: ``H_b v = ∇(g · v)``. The k second backwards run either as one
    vmapped backward (``is_grads_batched=True``, ``vectorize=True``) or as k sequential backwards on
    the retained graph (``vectorize=False``). Only one batch's graph is alive at a time (batches
    outer, chunks of vectors inner).
``"forward"``, forward-over-reverse
    ``torch.func.jvp`` of ``torch.func.grad`` over ``torch.func.functional_call``, vmapped over the
    k tangents (chunked). Non-selected parameters and buffers enter as constants. This is the
    torch.func path (``torch.compile`` may speed it up; not tried here); it rebuilds the forward and gradient for every
    chunk, so it costs more per vector than ``"reverse"`` on CPU.

Choice of ``vectorize`` (measured on this project's CPU machine: 2 shared, heavily loaded cores,
1 torch thread, torch 2.13; HF GPT-NeoX / Llama ≈0.9M parameters, eager attention, one batch
8×128; per-vector HVP time ÷ one gradient time, each paired with a gradient timed just before,
graph build included; two rounds each)::

                        k=1         k=8
    NeoX  sequential    4.19, 3.45  2.52, 1.72
    NeoX  vectorized    3.90, 4.13  2.84, 7.07
    Llama sequential    4.11, 3.27  2.41, 2.38
    Llama vectorized    3.89, 3.77  3.03, 2.62

The sequential second backwards win at k = 8 (vmap's batching rules add work on CPU), so
``vectorize="auto"`` picks sequential on CPU (:data:`AUTO_VECTORIZE_CPU`) and the vectorized
second backward on CUDA (unmeasured here; one kernel per op instead of k is the usual GPU win).
Full tables: ``python -m benchmarks.hvp_throughput``.

Conventions, side effects and guarantees of every call:

- attention runs under :func:`geometry.attention.second_order_attention` (SDPA MATH backend), so
  models using SDPA work without the caller knowing;
- the model is put in **eval mode** for the call (dropout off: the Hessian of a random function
  is not what anyone means), and every submodule's previous mode is restored afterwards;
- ``.grad`` of every parameter is left as it was (the same tensor object or ``None``): products
  use ``torch.autograd.grad``, never ``.backward()``, so no graph is ever attached to ``.grad``;
  ``requires_grad`` flags and parameter values are untouched;
- works in any floating dtype the model has (float64 for exact tests); all selected parameters
  must share one dtype and device;
- grad mode is switched on internally, so calls work inside ``torch.no_grad()``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import torch
from torch import nn

from .attention import second_order_attention
from .batches import normalise_batch_weights
from .operator import CurvatureOperator, OperatorError
from .params import ParamGlobs, ParamSpace, select_parameters

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Backend = Literal["reverse", "forward"]

#: Default bound on k per pass for the vmapped passes (vectorized reverse, forward). A vmapped
#: pass holds ~k copies of the backward's intermediates, so memory grows linearly with the chunk
#: (about k × the activation memory of one gradient); per-vector cost is flat beyond k ≈ 8.
DEFAULT_CHUNK = 16


class _LossModule(nn.Module):
    """``batch -> loss_fn(model, batch)`` as a module, so ``functional_call`` can swap parameters."""

    def __init__(self, model: nn.Module, loss_fn: LossFn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


class HessianOperator(CurvatureOperator):
    """Hessian of ``Σ_b w_b loss_fn(model, batch_b)`` w.r.t. selected parameters, as an operator.

    Args:
        model: any ``nn.Module``; read live at each call (weights copied into it later are used).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` (mean loss of the batch), e.g.
            :func:`probes.core.lm.lm_loss`.
        batches: non-empty sequence of batches (anything ``loss_fn`` accepts).
        params: ``None`` (every parameter with ``requires_grad``), a glob or a list of globs over
            parameter names (:func:`geometry.params.select_parameters`).
        weights: one non-negative weight per batch, normalised to sum 1; default
            :func:`~geometry.batches.default_batch_weight` (the batch size, i.e. an example-weighted mean).
        backend: ``"reverse"`` (default) or ``"forward"`` (see the module docstring).
        chunk_size: most vectors per pass. ``None``: :data:`DEFAULT_CHUNK` for vmapped passes
            (memory grows linearly in the chunk); sequential reverse passes take one at a time anyway.
        progress: show a tqdm bar over batches.
        vectorize: reverse backend only: ``True`` one vmapped second backward per chunk,
            ``False`` k sequential second backwards on the retained graph, ``"auto"`` the measured
            faster one for the device (module docstring).

    Cost of ``matmat`` on k vectors with B batches, in gradient-equivalents (one gradient = one
    forward + one backward of ``loss_fn``), measured on CPU: reverse ≈ B · (≈1.5 + ≈2·k) (one
    graph-building gradient with ``create_graph``, then one second backward per vector: ≈2.4
    gradients per vector at k = 8, ≈3.5–4 at k = 1); forward ≈ B · k · ≈4 (forward and gradient
    are re-run under the jvp for every chunk). Memory: one batch's double-backward graph plus the
    chunk's intermediates.

    Attributes:
        space: the :class:`ParamSpace` fixing names, shapes and flat order of the parameters.
        weights: normalised batch weights (tuple of floats).
        num_matvecs: number of Hessian-vector products computed so far.
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
    ):
        if not isinstance(model, nn.Module):
            raise OperatorError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise OperatorError("loss_fn must be callable as loss_fn(model, batch) -> scalar tensor")
        if isinstance(batches, torch.Tensor):
            raise OperatorError("batches must be a sequence of batches (e.g. a list of [b, s] tensors), not one tensor")
        batches = list(batches)
        if not batches:
            raise OperatorError("the batch list is empty: the Hessian needs at least one batch")
        if backend not in ("reverse", "forward"):
            raise OperatorError(f"backend must be 'reverse' or 'forward', got {backend!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise OperatorError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        if vectorize not in (True, False, "auto"):
            raise OperatorError(f"vectorize must be True, False or 'auto', got {vectorize!r}")

        selected = select_parameters(model, params)
        self.space = ParamSpace.from_params(selected)
        self.model = model
        self.loss_fn = loss_fn
        self.batches = batches
        self.weights = normalise_batch_weights(batches, weights, OperatorError)
        self.backend: Backend = backend
        self.chunk_size = chunk_size
        self.progress = progress
        self.vectorize = (self.space.device.type != "cpu" or AUTO_VECTORIZE_CPU) if vectorize == "auto" else bool(vectorize)
        self.num_matvecs = 0

    # ------------------------------------------------------------------ attributes
    @property
    def dim(self) -> int:
        return self.space.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.space.dtype

    @property
    def device(self) -> torch.device:
        return self.space.device

    def __repr__(self) -> str:
        mode = f"vectorize={self.vectorize}" if self.backend == "reverse" else "vmap"
        return (f"HessianOperator(dim={self.dim}, params={len(self.space.names)} tensors, batches={len(self.batches)}, "
                f"backend={self.backend!r}, {mode}, chunk_size={self.chunk_size}, dtype={self.dtype})")

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
        (vectors as rows); returns the same kind. Cost: k Hessian-vector products."""
        if isinstance(V, Mapping):
            k = self.space.check_dict(V, batched=True)
            if k == 0:
                raise OperatorError("k = 0: pass at least one vector")
            vs = [V[n].to(device=self.device, dtype=self.dtype) for n in self.space.names]
            outs = [torch.zeros_like(t) for t in vs]
            self._accumulate(vs, outs)
            self.num_matvecs += k
            return dict(zip(self.space.names, outs))
        if isinstance(V, torch.Tensor):
            return self.matmat_flat(V)
        raise OperatorError(f"matmat takes a dict of tensors or a flat [k, dim] tensor, got {type(V).__name__}")

    def gradient(self) -> tuple[float, torch.Tensor]:
        """``(L, ∇L)``: the weighted mean loss (float, the loss_fn's units) and its gradient, flat
        ``Tensor[dim]`` in :attr:`space` order. Cost: one gradient per batch."""
        grad = torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        total = 0.0
        with self._call_context() as params:
            for i, (w, batch) in enumerate(self._iter_batches("gradient")):
                loss = self._loss(params, batch, i)
                gs = torch.autograd.grad(loss, list(params.values()), allow_unused=True, materialize_grads=True)
                grad.add_(torch.cat([g.reshape(-1) for g in gs]), alpha=w)
                total += w * float(loss.detach())
        if not torch.isfinite(grad).all():
            raise OperatorError("the gradient is NaN/Inf; check the model's weights and the batches")
        return total, grad

    # ------------------------------------------------------------------ base-class hook
    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        k = V.shape[0]
        out = torch.zeros_like(V)
        # column blocks of a row-major [k, dim] tensor view as [k, *shape] without copies
        views_in = [V[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        views_out = [out[:, s].view(k, *shape) for s, shape in zip(self.space.slices.values(), self.space.shapes)]
        self._accumulate(views_in, views_out)
        return out

    # ------------------------------------------------------------------ internals
    def _iter_batches(self, desc: str) -> Iterator[tuple[float, Any]]:
        pairs = zip(self.weights, self.batches)
        if self.progress:
            from tqdm.auto import tqdm

            pairs = tqdm(pairs, total=len(self.batches), desc=desc, leave=False)
        for w, batch in pairs:
            if w > 0:
                yield w, batch

    def _current_params(self) -> dict[str, torch.Tensor]:
        """The selected parameters as they are in the model now (weights may have been replaced)."""
        named = dict(self.model.named_parameters())
        out = {}
        for name, shape in zip(self.space.names, self.space.shapes):
            p = named.get(name)
            if p is None or p.shape != shape or p.dtype != self.dtype or p.device != self.device:
                raise OperatorError(f"parameter {name!r} vanished or changed shape/dtype/device since the operator was built")
            out[name] = p
        return out

    @contextlib.contextmanager
    def _call_context(self) -> Iterator[dict[str, torch.Tensor]]:
        """Eval mode, MATH attention, grad enabled; restores modes and ``.grad`` afterwards."""
        modes = [(m, m.training) for m in self.model.modules()]
        grads = [(p, p.grad) for p in self.model.parameters()]
        params = self._current_params()
        self.model.eval()
        try:
            with torch.enable_grad(), second_order_attention():
                yield params
        finally:
            for m, training in modes:
                m.training = training
            for p, g in grads:
                if p.grad is not g:
                    p.grad = g

    def _loss(self, params: dict[str, torch.Tensor], batch: Any, index: int) -> torch.Tensor:
        loss = self.loss_fn(self.model, batch)
        self._check_loss(loss, index)
        if not loss.requires_grad:
            raise OperatorError(
                f"the loss of batch {index} has no autograd graph: it does not depend on the selected "
                "parameters, or loss_fn detaches it / runs under torch.no_grad()"
            )
        return loss

    @staticmethod
    def _check_loss(loss: Any, index: int, finite: bool = True) -> None:
        if not isinstance(loss, torch.Tensor):
            raise OperatorError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} on batch {index}")
        if loss.ndim != 0:
            raise OperatorError(
                f"loss_fn must return a scalar (0-dim) mean loss; got shape {tuple(loss.shape)} on batch {index}"
            )
        if not loss.is_floating_point():
            raise OperatorError(f"loss_fn returned a {loss.dtype} tensor; the loss must be floating point")
        if finite and not torch.isfinite(loss.detach()).all():
            raise OperatorError(f"the loss is {float(loss.detach())} on batch {index}; the Hessian of a non-finite loss is undefined")

    def _chunk(self, k: int, vmapped: bool) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return DEFAULT_CHUNK if vmapped else k

    def _accumulate(self, vs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        """``outs[j] += Σ_b w_b (H_b V)_j`` for V given per parameter as ``vs[j]`` [k, *shape_j]."""
        with self._call_context() as params:
            if self.backend == "reverse":
                self._reverse(params, vs, outs)
            else:
                self._forward(params, vs, outs)
        for name, o in zip(self.space.names, outs):
            if not torch.isfinite(o).all():
                raise OperatorError(f"the Hessian-vector product is NaN/Inf (first at parameter {name!r}); "
                                    "check the model's weights, the vectors and the loss")

    def _reverse(self, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        tensors = list(params.values())
        k = vs[0].shape[0]
        chunk = self._chunk(k, self.vectorize)
        for i, (w, batch) in enumerate(self._iter_batches("hvp")):
            loss = self._loss(params, batch, i)
            grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True, materialize_grads=True)
            # gradients that do not depend on θ (loss linear in that tensor) have zero Hessian rows
            live = [j for j, g in enumerate(grads) if g.requires_grad]
            if not live:
                continue
            outputs = [grads[j] for j in live]
            for start in range(0, k, chunk):
                stop = min(start + chunk, k)
                if self.vectorize:
                    hv = torch.autograd.grad(
                        outputs, tensors, grad_outputs=[vs[j][start:stop] for j in live], retain_graph=True,
                        is_grads_batched=True, allow_unused=True, materialize_grads=True,
                    )
                    for o, h in zip(outs, hv):
                        o[start:stop].add_(h, alpha=w)
                else:
                    for r in range(start, stop):
                        hv = torch.autograd.grad(
                            outputs, tensors, grad_outputs=[vs[j][r] for j in live], retain_graph=True,
                            allow_unused=True, materialize_grads=True,
                        )
                        for o, h in zip(outs, hv):
                            o[r].add_(h, alpha=w)
            del grads, outputs, loss  # free this batch's graph before the next batch

    def _forward(self, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        from torch.func import functional_call, grad, jvp, vmap

        wrapper = _LossModule(self.model, self.loss_fn)
        names = self.space.names
        primals = {n: p.detach() for n, p in params.items()}
        selected = {id(p) for p in params.values()}
        consts = {"model." + n: p.detach() for n, p in self.model.named_parameters() if id(p) not in selected}
        k = vs[0].shape[0]
        chunk = self._chunk(k, True)
        for i, (w, batch) in enumerate(self._iter_batches("hvp")):

            def loss_of(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
                full = {"model." + n: t for n, t in p.items()}
                full.update(consts)
                loss = functional_call(wrapper, full, (batch,))
                self._check_loss(loss, i, finite=False)  # values are checked outside the transforms
                return loss, loss.detach()

            grad_fn = grad(loss_of, has_aux=True)

            def hvp(t: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
                _, tangent_out, aux = jvp(grad_fn, (primals,), (t,), has_aux=True)
                return tangent_out, aux

            batched = vmap(hvp, in_dims=(0,), randomness="same")
            for start in range(0, k, chunk):
                stop = min(start + chunk, k)
                hv, losses = batched({n: v[start:stop] for n, v in zip(names, vs)})
                if not torch.isfinite(losses).all():
                    raise OperatorError(f"the loss is {float(losses.reshape(-1)[0])} on batch {i}; "
                                        "the Hessian of a non-finite loss is undefined")
                for n, o in zip(names, outs):
                    o[start:stop].add_(hv[n], alpha=w)


#: Measured choice for ``vectorize="auto"`` on CPU (see the module docstring's table).
AUTO_VECTORIZE_CPU = False

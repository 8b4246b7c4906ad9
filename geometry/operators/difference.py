"""The gradient-difference Hessian-vector product: first-order gradients only (docs/science.md §4 (c)).

:class:`DifferenceBackend` (``HessianOperator(..., backend="difference")``) computes

    H v ≈ (∇L(θ + εv) − ∇L(θ − εv)) / (2ε)                          (central: 2 gradients, O(ε²))
    H v ≈ (4 D(ε/2) − D(ε)) / 3,  D(h) = (∇L(θ+hv) − ∇L(θ−hv))/(2h)   (Richardson: 4 gradients, O(ε⁴))

with gradients made the way training makes them: the parameters are perturbed **in place**, then
``loss_fn(model, batch).backward()`` fills ``.grad`` for each batch, which is read, weighted by the
batch weight and accumulated in the operator's vector dtype. Nothing needs a double backward or a
forward-AD rule, so the same code runs where training runs: fused attention kernels (no SDPA
MATH context is entered), HF activation checkpointing (layers flagged ``gradient_checkpointing``
run with ``training=True`` on the layer itself so that HF checkpoints them; their children,
dropout included, stay in eval mode), a model's own fused losses, and hooks that act on ``.grad``
(data-parallel all-reduce, FSDP2 reduce-scatter).

Precision. By default a float16/bfloat16 model's products run in float32 (its weights upcast for
the call: :mod:`losslens.geometry.operators.precision`), so θ, the step and the gradients are float32 and
what follows applies to an explicit ``compute_dtype="bfloat16"`` (or float16). The perturbed point
is built from a kept **master copy** of θ, taken in float32 for float16/bfloat16 parameters:
``θ_master + s·ε·v`` is computed in float32 and cast once to the parameters' dtype. (A
half-precision number converts to float32 exactly, so the master is stored as a copy in the
parameters' dtype and converted one tensor at a time: the float32 master at half the memory.)
Gradients are read in the parameters' dtype and accumulated, weighted and differenced in
:attr:`~HessianOperator.dtype` (float32 at least). In half precision the cast of the perturbed
weights to bfloat16 limits accuracy: the realised step is ``round(θ + εv) − θ``, off by up to half
an ulp of each weight (2⁻⁹ relative in bfloat16), and the gradients carry bfloat16 rounding;
benchmarks/README.md ("Gradient-difference HVPs") measures the result against float64.

Step size (a relative step). With ``u`` the unit roundoff of the gradients (``torch.finfo(dtype).eps``
of the parameters), the central difference's error is ``≈ ε²‖T[v,v]‖/6`` (truncation, T the third
derivative) plus ``≈ u‖∇L‖/ε`` (rounding of two gradients of size ‖∇L‖, divided by 2ε); it is
smallest at ``ε ∝ u^(1/3)``. Measured in units of the weights it moves: each moved weight should
move by about ``h`` times the typical weight ``‖θ‖/√n``, whether v is spread over all n coordinates
or concentrated on a few (an eigenvector living in a few rows, where the third derivative is large).
With ``k = ‖v‖₂⁴ / ‖v‖₄⁴`` the number of coordinates v effectively occupies (its participation
ratio: n for a Rademacher vector, n/3 for a Gaussian one, k for one spread evenly over k), the move
is ``‖εv‖ = h · max(1, ‖θ‖) · √(k/n)``, i.e.

    ε = h · max(1, ‖θ‖) · ‖v‖₂ / (√n · ‖v‖₄²),   h = c · u^(1/3)  (central),   h = c_R · u^(1/5)  (Richardson)

(``ε = h·max(1,‖θ‖)/‖v‖`` for a Rademacher v; Richardson's truncation is O(ε⁴), so its balance is
at ``u^(1/5)``). The √(k/n) factor was measured to matter for solvers: with the plain ``‖v‖`` rule,
Lanczos' λ_max in float32 was off by 2e-3 to 2e-2 (Richardson: up to 220%, a spurious Ritz value)
while random products were within 4e-4; with it, λ_max is within 5e-4 and the products unchanged
for Rademacher vectors. ``c_R`` = :data:`RICHARDSON_STEP_CONSTANT` = 0.05; ``c`` =
:data:`STEP_CONSTANT` = 0.1 was measured on ten tiny families (benchmarks/README.md, "Step
constant"): random products are rounding-dominated there (error ∝ 1/c up to c ≈ 0.15:
0.9e-4–6.6e-4 at 0.1 against 1.8e-4–1.27e-3 at 0.05), while Hutchinson's
Rademacher probes and the vectors Lanczos converges to are truncation-dominated (error ∝ c²); the
latter are answered by refined Rayleigh quotients ("Eigenvalues" below). ``DifferenceBackend(step=h)``
overrides h.

Piecewise activations (ReLU, LeakyReLU, Hardtanh, ReLU², xIELU) are frozen on their branch at θ
for the products (:mod:`losslens.geometry.operators.branches`: one forward at θ per batch records the masks),
so the function differenced is smooth and has the Hessian of the model at θ: on tiny Apertus models
(xIELU) this took the float32 products from 1–8e-3 (a kink crossed) to the other families' level.
xIELU's clamp window is closed as well (:func:`~losslens.geometry.operators.smoothness.continuous_gradients`).

Eigenvalues. The vectors an eigen solver converges to are concentrated (participation ratio
k/n ≈ 0.005–0.03 against 1/3 for a Gaussian vector) and their products are truncation-dominated:
the Ritz vectors of a float32 difference Lanczos are within 1e-6 of the exact eigenvectors' Rayleigh
quotients, but the Ritz values were up to 9.6e-3 off (c = 0.1). So
:func:`~losslens.geometry.estimators.eigen.top_eigenvalues`
returns the Rayleigh quotients ``vᵀHv`` of its Ritz vectors measured with Richardson's stencil at
half the central step (:meth:`DifferenceBackend.refined`; O(ε⁴) truncation, 3× the central rounding,
which λ's size makes small): within 1.8e-4 on the tiny families (benchmarks/README.md, "Step constant").
The residuals ``‖Hv − λv‖`` that decide ``converged`` come from the same refined products: the
central ones measured the distance to the eigenvectors of the central stencil's operator and
understated the true residual up to 16× (benchmarks/README.md, "Residuals of a difference eigen
solve"). Cost: the solver's final block of k products, at 4 gradients each instead of 2.

θ comes back **bit-exactly** after every product: it is copied back from the master copy
(``p.copy_(master)``; a bfloat16 → float32 → bfloat16 round trip is exact), never un-perturbed by
subtracting εv. The caller's ``.grad`` (and ``requires_grad``, modes) are restored by the operator.

Cost per product: 2 gradients (central) or 4 (Richardson) per batch, plus the read-out. The
error check against exact products is :mod:`losslens.geometry.operators.product_check`.
Memory beyond the input and output vectors (:func:`pass_bytes`): the master copy (dim numbers in
the parameters' dtype: the θ backup), one gradient pass
of the largest batch (its activations, with checkpointing where on, and ``.grad`` in the
parameters' dtype, measured once per batch shape on one and two rows by :func:`gradient_pass_bytes`), and one
parameter tensor in float32 (the perturbation's cast), plus the branch masks of every batch (one
byte per input element of each frozen activation, :mod:`losslens.geometry.operators.branches`). The first
gradient of the pair is held, weighted, in the product's output row while the second is computed,
so it takes no extra memory.

Error is measured, not assumed: :func:`product_error` compares the products with the exact
reverse-over-reverse products on a check slice (``HessianOperator.checked()``), and every
estimator plan records the result (``memory["settings"]["hvp_check"]``).

One loop (:func:`difference_products`) serves one process, data-parallel ranks (each rank's
batches, then the operator all-reduces) and FSDP2 shards (:mod:`losslens.geometry.operators.sharded`): the
norms of the step rule go through a :class:`~losslens.geometry.operators.backend.VectorSpace`, whole or
all-reduced.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from losslens.geometry.memory.graphs import first_rows, one_row, peak_new_bytes
from losslens.geometry.operators.backend import LOCAL, ProductBackend, VectorSpace
from losslens.geometry.operators.product_check import measure
from losslens.geometry.operators.branches import FrozenBranches
from losslens.geometry.operators.smoothness import SMOOTH, activation_smoothness, continuous_gradients

__all__ = [
    "STEP_CONSTANT",
    "RICHARDSON_STEP_CONSTANT",
    "REFINED_STEP_FRACTION",
    "DEFAULT_TOLERANCE",
    "relative_step",
    "step_size",
    "stencil",
    "checkpointing_layers",
    "difference_products",
    "gradient_pass_bytes",
    "pass_bytes",
    "DifferenceBackend",
]

#: ``c`` in the central rule ``h = c · u^(1/3)``, measured on
#: ten tiny families (benchmarks/README.md, "Gradient-difference HVPs", "Step constant").
STEP_CONSTANT = 0.1
#: ``c`` of Richardson's rule ``h = c · u^(1/5)``: its step is ~8× the central one, and at 0.1 a
#: float32 Lanczos on it met a spurious Ritz value (12% off, llama seed 2); 0.05 does not
#: (benchmarks/README.md, "Step constant").
RICHARDSON_STEP_CONSTANT = 0.05
#: The refined products of an eigen solve (:meth:`DifferenceBackend.refined`) take Richardson's
#: stencil at this fraction of the central step (benchmarks/README.md, "Step constant").
REFINED_STEP_FRACTION = 0.5
#: Default relative error at which ``backend="auto"`` refuses the difference backend.
DEFAULT_TOLERANCE = 2e-2


def relative_step(dtype: torch.dtype, richardson: bool = False) -> float:
    """``h`` of the step rule for gradients computed in ``dtype``: ``c · u^(1/3)`` (central) or
    ``c_R · u^(1/5)`` (Richardson), ``u = torch.finfo(dtype).eps``."""
    u = float(torch.finfo(dtype).eps)
    return RICHARDSON_STEP_CONSTANT * u**0.2 if richardson else STEP_CONSTANT * u ** (1 / 3)


def step_size(h: float, theta_norm: float, v_norm: float, v4: float, n: int) -> float:
    """ε = h · max(1, ‖θ‖) · ‖v‖₂ / (√n · ‖v‖₄²) for ``v_norm`` = ‖v‖₂, ``v4`` = ‖v‖₄² = √(Σ vᵢ⁴)
    and n coordinates: each coordinate v occupies moves by ≈ h · max(1, ‖θ‖)/√n (module docstring)."""
    return h * max(1.0, theta_norm) * v_norm / (math.sqrt(n) * v4)


def stencil(eps: float, richardson: bool = False) -> list[tuple[float, float]]:
    """``[(shift, coefficient)]``: H v ≈ Σ coefficient · ∇L(θ + shift · v)."""
    if not richardson:
        return [(eps, 0.5 / eps), (-eps, -0.5 / eps)]
    # (4 D(ε/2) − D(ε)) / 3 with D(h) = (g(h) − g(−h)) / 2h
    return [(eps, -1 / (6 * eps)), (-eps, 1 / (6 * eps)), (eps / 2, 4 / (3 * eps)), (-eps / 2, -4 / (3 * eps))]


@contextlib.contextmanager
def checkpointing_layers(model: nn.Module) -> Iterator[list[nn.Module]]:
    """Modules with ``gradient_checkpointing = True`` (HF ``gradient_checkpointing_enable()``) get
    ``training=True`` on themselves only for the block (HF checkpoints a layer only in training
    mode); their children keep their mode (eval: no dropout). Restored on exit."""
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    saved = [(m, m.training) for m in flagged]
    for m in flagged:
        m.training = True
    try:
        yield flagged
    finally:
        for m, flag in saved:
            m.training = flag


def difference_products(
    params: Sequence[torch.Tensor],
    items: Sequence[tuple[int, float, Any]],
    loss_of: Callable[[Any, int], torch.Tensor],
    vs: list[torch.Tensor],
    outs: list[torch.Tensor],
    h: float,
    richardson: bool = False,
    space: VectorSpace = LOCAL,
    tensors: Sequence[torch.Tensor] | None = None,
    grad_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    replay: Callable[[int], contextlib.AbstractContextManager] | None = None,
) -> int:
    """``outs[j][r] += Σ_b w_b (H_b v_r)_j`` by gradient differences; returns the gradients computed.

    Args:
        params: the selected live parameters (``requires_grad`` set for the call, ``.grad`` read).
        items: ``(index, weight, batch)`` of every batch to run (a zero weight still runs: FSDP2's
            backward is a collective).
        loss_of: ``loss_of(batch, index)`` -> scalar loss with a graph (the forward of one batch).
        vs, outs: per parameter ``[k, *shape]`` vectors and outputs in the operator's vector dtype.
        h: relative step (:func:`relative_step`); ``richardson``: 4 gradients per product.
        space: how ‖θ‖, ‖v‖₂, ‖v‖₄ and n are measured: this rank's whole vectors
            (:data:`~losslens.geometry.operators.backend.LOCAL`) or shards summed over ranks.
        tensors: the storage perturbed in place, one per parameter (default: ``params``; FSDP2:
            the local shards), restored bit-exactly from a master copy, also on error.
        grad_of: reads a parameter's ``.grad`` as a tensor shaped like its ``tensors`` entry
            (default: ``.grad`` itself; FSDP2: its local shard).
        replay: ``replay(index)`` -> the context each gradient of batch ``index`` runs in
            (:meth:`FrozenBranches.replay <losslens.geometry.operators.branches.FrozenBranches.replay>`).

    Cost: k · (2 or 4) · len(items) gradients (forward + ``loss.backward()``).
    """
    params = list(params)
    tensors = params if tensors is None else list(tensors)
    # the kept original θ in the parameters' dtype; for half precision it *is* the float32 master:
    # a bfloat16/float16 number converts to float32 exactly (one tensor at a time, below)
    master = [p.detach().clone() for p in tensors]
    theta_norm = space.norm(master)
    k, n = vs[0].shape[0], space.numel(master)
    saved_flags = [p.requires_grad for p in params]
    count = 0
    try:
        for p in params:
            p.requires_grad_(True)
        for r in range(k):
            v_norm, v4 = space.norms([v[r] for v in vs])
            if v_norm == 0.0:
                continue  # H 0 = 0
            for shift, coef in stencil(step_size(h, theta_norm, v_norm, v4, n), richardson):
                with torch.no_grad():
                    for t, m, v in zip(tensors, master, vs):
                        torch.add(m.to(v.dtype), v[r], alpha=shift, out=t)  # in float32 at least, cast once
                for index, w, batch in items:
                    for p in params:
                        p.grad = None
                    with replay(index) if replay is not None else contextlib.nullcontext():
                        loss_of(batch, index).backward()
                    count += 1
                    for p, o in zip(params, outs):
                        if p.grad is not None:
                            o[r].add_((p.grad if grad_of is None else grad_of(p.grad)).to(o.dtype), alpha=w * coef)
    finally:
        with torch.no_grad():
            for t, m in zip(tensors, master):
                t.copy_(m)
        for p, flag in zip(params, saved_flags):
            p.grad = None
            p.requires_grad_(flag)
    return count


def gradient_pass_bytes(loss_of: Callable[[], torch.Tensor], params: dict[str, torch.Tensor]) -> int:
    """Peak bytes of one ``loss_of().backward()`` beyond what is resident: activations (as the
    model saves them: with checkpointing, the layer inputs plus one layer's recompute), the loss's
    temporaries and the ``.grad`` tensors it allocates (measured with
    :func:`losslens.geometry.memory.graphs.peak_new_bytes`; cost: one gradient). ``.grad`` is cleared after."""
    tensors = list(params.values())
    saved = [p.grad for p in tensors]
    try:
        for p in tensors:
            p.grad = None
        _, peak = peak_new_bytes(lambda: loss_of().backward())
    finally:
        for p, g in zip(tensors, saved):
            p.grad = g
    return int(peak)


def pass_bytes(
    one_row_bytes: int,
    two_rows: int | None,
    rows: int,
    dim: int,
    param_dtype: torch.dtype,
    largest: int,
    transient: int = 0,
) -> int:
    """Predicted peak of one difference product beyond its input and output vectors.

    ``one_row_bytes`` / ``two_rows``: :func:`gradient_pass_bytes` of a one-row and a two-row copy of the
    largest batch (``two_rows`` None for one-row batches), extrapolated linearly to ``rows`` (the
    ``.grad`` part does not grow with the rows, the activations do); plus the kept θ (dim numbers
    in the parameters' dtype), one parameter tensor of ``largest`` numbers in float32 (its float32
    view and the perturbation's cast) and the loss's temporaries.
    """
    per_row = 0 if two_rows is None else max(0, two_rows - one_row_bytes)
    gradient = one_row_bytes + (rows - 1) * per_row
    master = dim * param_dtype.itemsize
    return int(master + gradient + 4 * largest + transient)


class DifferenceBackend(ProductBackend):
    """Gradient-difference products (module docstring): first order only, its error measured.

    Args:
        step: the relative step h (default :func:`relative_step` of the products' dtype).
        richardson: the 4-gradient Richardson stencil (O(ε⁴)).
        check_batches: the batches of the error check (default: a one-row copy of the first batch).
        tolerance: the measured relative error above which an operator on it warns
            (``ProductErrorWarning``) and ``backend="auto"`` refuses it (default :data:`DEFAULT_TOLERANCE`).
    """

    name = "difference"
    exact = False
    second_order = False
    shardable = True
    summary = "gradient differences, first order only; error measured and recorded"

    def __init__(
        self,
        step: float | None = None,
        richardson: bool = False,
        check_batches: Sequence[Any] | None = None,
        tolerance: float = DEFAULT_TOLERANCE,
    ):
        #: the relative step h given (None: :func:`relative_step` of the products' dtype, :meth:`step`)
        self.h = step
        self.richardson, self.check_batches, self.tolerance = bool(richardson), check_batches, float(tolerance)

    def __repr__(self) -> str:
        return f"DifferenceBackend(step={self.h}, richardson={self.richardson}, tolerance={self.tolerance:g})"

    def with_check_batches(self, check_batches: Sequence[Any]) -> "DifferenceBackend":
        """These settings with ``check_batches`` as the error check's batches."""
        return DifferenceBackend(self.h, self.richardson, check_batches, self.tolerance)

    @contextlib.contextmanager
    def attention(self, model: nn.Module) -> Iterator[None]:
        """Whatever attention the model runs (first order only), checkpointed layers flagged,
        xIELU's clamp window closed (:func:`~losslens.geometry.operators.smoothness.continuous_gradients`)."""
        with checkpointing_layers(model), continuous_gradients(model):
            yield

    def step(self, op: Any) -> float:
        """The relative step h: the one given, else :func:`relative_step` of the parameters' dtype."""
        return self.h or relative_step(op.param_dtype, self.richardson)

    def products(
        self, op: Any, params: dict[str, torch.Tensor], vs: list[torch.Tensor], outs: list[torch.Tensor]
    ) -> None:
        items = [(i, w, b) for i, (w, b) in op.batch_items("hvp")]
        branches = FrozenBranches(op.model)
        with branches.active():  # the branch of every piecewise activation at θ, replayed at θ ± εv
            replay = branches.record_all(items, lambda b, i: op.batch_loss(params, b, i, graph=False))
            op.num_gradients += difference_products(
                list(params.values()),
                items,
                lambda b, i: op.batch_loss(params, b, i),
                vs,
                outs,
                self.step(op),
                self.richardson,
                replay=replay,
            )

    def pass_bytes(self, op: Any, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """:func:`pass_bytes`, the largest over the operator's batches, each batch shape's gradient
        pass measured once on a one-row and a two-row copy (cost: two small gradients per shape);
        plus the branch masks of every batch (:mod:`losslens.geometry.operators.branches`: one byte per
        input element of each frozen activation, measured on the one-row copy, times the rows)."""
        largest = max(math.prod(s) for s in op.space.shapes)
        out = masks = 0
        for i, batch in enumerate(op.batches):
            rows, sliced, key = one_row(batch)
            key = ("first-order", key)
            if key not in op.measured_passes:
                with op.call_context(self) as params:
                    one = gradient_pass_bytes(lambda: op.batch_loss(params, sliced, i), params)
                    two = (
                        None
                        if rows < 2
                        else gradient_pass_bytes(lambda: op.batch_loss(params, first_rows(batch, 2), i), params)
                    )
                    branches = FrozenBranches(op.model)
                    with branches.active():
                        if branches:
                            branches.record(i, lambda: op.batch_loss(params, sliced, i, graph=False))
                        op.measured_passes[("branch masks", key)] = branches.mask_bytes
                op.measured_passes[key] = (one, two)
            one, two = op.measured_passes[key]
            masks += rows * op.measured_passes[("branch masks", key)]
            out = max(out, pass_bytes(one, two, rows, op.dim, op.param_dtype, largest, op.loss_transient_bytes))
        return out + masks

    def pass_options(self, op: Any, k: int, calls: int, hvps: int) -> list[tuple[dict[str, Any], int, float]]:
        """One option: 2 gradients per vector (4 with Richardson); the measured error is recorded."""
        settings = {"backend": self.name, "hvp_check": op.checked(), "backend_choice": op.backend_choice}
        return [(settings, op.pass_bytes(k), (4.0 if self.richardson else 2.0) * hvps)]

    def check(self, op: Any) -> dict:
        return measure(op, self)

    def refined(self, op: Any) -> "DifferenceBackend | None":
        """Richardson's stencil at :data:`REFINED_STEP_FRACTION` of the central step (module docstring,
        "Eigenvalues"): the backend of an eigen solve's final Rayleigh quotients. None where some
        activations are not smooth (Richardson cannot cancel a kink)."""
        if activation_smoothness(op.model)[0] < SMOOTH:
            return None
        central = self.h if self.h and not self.richardson else None
        step = central or REFINED_STEP_FRACTION * relative_step(op.param_dtype)
        return DifferenceBackend(step, True, self.check_batches, self.tolerance)

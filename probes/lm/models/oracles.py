"""Second derivatives of a loss from loss values alone: an oracle that shares no code with autograd.

``exact_hessian`` (double backward, row by row) uses the same machinery as the reverse HVP backend,
and :func:`~losslens.lm.models.fd_references.fd_hvp` (differences of gradients) trusts first-order
autograd. :class:`LossOracle` uses **forward passes only**, under ``torch.no_grad()``:

* vᵀHv from the second difference of the loss, D(h) = (L(θ+hv) − 2L(θ) + L(θ−hv))/h², whose error
  is a series in even powers of h; a Richardson table over h, h/2, ..., h/2^m removes the h², h⁴,
  ... terms (:meth:`LossOracle.quadratic`). The difference between the last two diagonal entries of
  the table is returned as the estimate's own error;
* uᵀHv by polarisation, ((u+v)ᵀH(u+v) − (u−v)ᵀH(u−v))/4 (:meth:`LossOracle.bilinear`);
* entries and blocks H[I, I] from those (:meth:`LossOracle.block`), for tiny models.

Precision: the oracle evaluates a **float64 copy** of the model (the caller's model is never
written) inside :func:`float64_everywhere`, a ``TorchFunctionMode`` that serves every request for
float32 (``.float()``, ``.to(torch.float32)``, ``dtype=torch.float32``, e.g. HF's RMSNorm and eager
softmax upcasts) in float64. Without it a float64 HF model rounds its norms to float32, which puts
noise of ~1e-7·``|L|`` into every loss value and, divided by h², swamps a second difference. With it,
loss values carry ~1e-15 relative noise; on the six seed families (2 seeds, step 0.05 and two
halvings) vᵀHv agreed with both backends' float64 products to ≤ 7e-9·‖Hv‖ and with their float32
products to ≤ 5e-8·‖Hv‖ (tests/test_oracles.py asserts 1e-7 and 2e-6). Run the products you check inside the same
context (or compare a float32 model at float32 tolerance).

Validity: the loss must be four times differentiable along the segment θ ± step·v̂ for the
Richardson table to mean anything; an activation with a kink or a jump (Apertus' xIELU has both,
within 1e-6 of 0) needs a step small enough that few activations cross it (tests/test_oracles.py
uses 3e-3 there; 0.05 elsewhere).

Cost: one quadratic = 2(m+1) + 1 forward passes over the batches (the centre value is cached);
one bilinear = two quadratics; a block of k indices = k + k(k−1) quadratics. Memory: one float64
copy of the model plus the selected parameters' original values.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from losslens.geometry.base.batches import normalise_batch_weights
from losslens.geometry.base.params import ParamGlobs, ParamSpace, select_parameters

__all__ = ["LossOracle", "OracleValue", "float64_everywhere"]


def _promote(x: Any) -> Any:
    if x is torch.float32:
        return torch.float64
    if isinstance(x, (list, tuple)):
        return type(x)(_promote(y) for y in x)
    return x


class _Float64Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        return func(*_promote(tuple(args)), **{k: _promote(v) for k, v in kwargs.items()})


@contextlib.contextmanager
def float64_everywhere() -> Iterator[None]:
    """Inside the block every torch call asking for float32 gets float64 instead (see the module
    docstring). Meant for float64 models: it makes HF's float32 upcasts exact."""
    with _Float64Mode():
        yield


def _to64(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(torch.float64) if batch.is_floating_point() else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to64(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _to64(v) for k, v in batch.items()}
    return batch


@dataclass(frozen=True)
class OracleValue:
    """A second derivative from loss values: ``value`` and ``error``, the spread of the last two
    Richardson estimates (its own accuracy), both in loss units × (vector norm)²."""

    value: float
    error: float


class LossOracle:
    """vᵀHv, uᵀHv and Hessian blocks of ``Σ_b w_b loss_fn(model, batch_b)`` from loss values only.

    Args:
        model: any ``nn.Module``; copied to float64 (eval mode); the original is not touched.
        loss_fn: ``loss_fn(model, batch) -> scalar`` (mean loss of the batch).
        batches: the batches; floating tensors in them are converted to float64.
        params: globs of the parameters (flat vectors follow their order; default all trainable).
        weights: batch weights (default: ``loss_fn.batch_weight`` of each batch when the loss carries it,
            else batch sizes, as :class:`HessianOperator`), normalised.
        step: largest step h along a unit vector; ``levels`` halvings after it (Richardson order 2·levels+2).
        exact64: evaluate inside :func:`float64_everywhere`.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        batches: Sequence[Any],
        params: ParamGlobs = None,
        weights: Sequence[float] | None = None,
        step: float = 2e-2,
        levels: int = 3,
        exact64: bool = True,
    ):
        if step <= 0 or levels < 1:
            raise ValueError(f"LossOracle needs step > 0 and levels >= 1, got step={step}, levels={levels}")
        names = list(select_parameters(model, params))
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        named = dict(self.model.named_parameters())
        self.params = {n: named[n] for n in names}
        self.space = ParamSpace.from_params(self.params)
        self.loss_fn = loss_fn
        self.batches = [_to64(b) for b in batches]
        self.weights = normalise_batch_weights(list(batches), weights, ValueError, loss_fn)
        self.step, self.levels, self.exact64 = float(step), int(levels), exact64
        self.origin = {n: p.detach().clone() for n, p in self.params.items()}
        self.num_losses = 0
        self._centre: float | None = None

    @classmethod
    def of(cls, op, **kw) -> "LossOracle":
        """The oracle of a :class:`~losslens.geometry.operators.hessian.HessianOperator`'s loss (same model,
        loss, batches, weights and parameters; flat vectors in ``op.space`` order)."""
        from losslens.geometry.base.params import literal_glob

        return cls(op.model, op.loss_fn, op.batches, [literal_glob(n) for n in op.space.names], op.weights, **kw)

    # ------------------------------------------------------------------ loss values
    def loss(self, direction: torch.Tensor | None = None, t: float = 0.0) -> float:
        """L(θ + t·direction) in float64 (direction flat [dim]); one forward per batch."""
        ctx = float64_everywhere() if self.exact64 else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            for n, p in self.params.items():
                p.copy_(self.origin[n])
                if direction is not None and t != 0.0:
                    p.add_(direction[self.space.slices[n]].view_as(p).to(p), alpha=t)
            total = 0.0
            for w, b in zip(self.weights, self.batches):
                if w > 0:
                    total += w * float(self.loss_fn(self.model, b))
        self.num_losses += 1
        return total

    def _centre_loss(self) -> float:
        if self._centre is None:
            self._centre = self.loss()
        return self._centre

    # ------------------------------------------------------------------ second derivatives
    def quadratic(self, v: torch.Tensor) -> OracleValue:
        """vᵀHv for a flat vector v [dim] (any norm), Richardson-extrapolated second differences."""
        v = v.detach().to(torch.float64).cpu().reshape(-1)
        if v.numel() != self.space.dim:
            raise ValueError(f"vector has {v.numel()} entries, the parameter space {self.space.dim}")
        norm = float(torch.linalg.vector_norm(v))
        if norm == 0:
            return OracleValue(0.0, 0.0)
        u = (v / norm).to(self.space.device)
        c = self._centre_loss()
        table: list[list[float]] = []
        for i in range(self.levels + 1):
            h = self.step / 2**i
            row = [(self.loss(u, h) - 2 * c + self.loss(u, -h)) / h**2]
            for j in range(1, i + 1):
                row.append(row[j - 1] + (row[j - 1] - table[i - 1][j - 1]) / (4**j - 1))
            table.append(row)
        best, prev = table[-1][-1], table[-1][-2]
        return OracleValue(best * norm**2, abs(best - prev) * norm**2)

    def bilinear(self, u: torch.Tensor, v: torch.Tensor) -> OracleValue:
        """uᵀHv by polarisation: ((u+v)ᵀH(u+v) − (u−v)ᵀH(u−v))/4. Cost: two quadratics."""
        u = u.detach().to(torch.float64).reshape(-1)
        v = v.detach().to(torch.float64).reshape(-1)
        a, b = self.quadratic(u + v), self.quadratic(u - v)
        return OracleValue((a.value - b.value) / 4, (a.error + b.error) / 4)

    def block(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(H[I, I], error[I, I])`` float64 [k, k] for flat indices I (diagonal by quadratics,
        off-diagonal by polarisation of unit vectors). Cost: k + k(k−1) quadratics."""
        k = len(indices)
        H = torch.zeros(k, k, dtype=torch.float64)
        E = torch.zeros(k, k, dtype=torch.float64)

        def unit(i: int) -> torch.Tensor:
            e = torch.zeros(self.space.dim, dtype=torch.float64)
            e[indices[i]] = 1.0
            return e

        for i in range(k):
            r = self.quadratic(unit(i))
            H[i, i], E[i, i] = r.value, r.error
            for j in range(i):
                r = self.bilinear(unit(i), unit(j))
                H[i, j] = H[j, i] = r.value
                E[i, j] = E[j, i] = r.error
        return H, E

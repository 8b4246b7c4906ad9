"""The interface every curvature estimator consumes: a symmetric linear operator on flat vectors.

Estimators (trace, eigenvalues, density, ...) only need ``matmat`` on flat ``[k, dim]`` blocks plus
a few attributes, so they run unchanged on the exact :class:`~losslens.geometry.operators.dense.DenseOperator` (tests,
tiny problems) and on the Hessian-vector-product :class:`~losslens.geometry.operators.hessian.HessianOperator`.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import torch

from losslens.geometry.base._linalg import CHUNK
from losslens.geometry.base.params import ParamSpace
from losslens.geometry.base.errors import LosslensError


class OperatorError(LosslensError, ValueError):
    """Bad input to a linear operator (wrong shape, k = 0, non-finite result, ...)."""


def estimator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype estimator vectors and linear algebra use for an operator whose products run in
    ``dtype``: float32 for half precision (float16/bfloat16), ``dtype`` itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def is_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite: the float64 sum of finite float32 entries is finite,
    and any NaN/Inf makes it NaN/Inf. Summed ``CHUNK`` (2 Mi) entries at a
    time: on CPU ``x.sum(dtype=torch.float64)`` first casts the whole of ``x`` to float64, an
    unplanned temporary of 8 bytes per entry (563 MB for one Pythia-70m vector; issue #22).
    A non-contiguous ``x`` is checked a contiguous row at a time (the ``[k, *shape]`` views of a
    row-major ``[k, dim]`` block: each row is), else ``torch.isfinite`` on at most ``CHUNK`` entries
    at a time: ``torch.isfinite`` of the whole view allocates ``|x|`` in its dtype and three bool
    tensors, 7 bytes per float32 entry (1.44 GB for the products of 8 vectors on Pythia-70m's
    embedding, which made peak RSS 6% over the memory plan; issue #35).
    Temporaries: one float64 chunk (16.8 MB), or one chunk of ``x``'s dtype and three bool chunks
    (≤ 23 MB); one host synchronisation per contiguous piece."""
    if not x.is_contiguous():
        if x.ndim == 0:
            return bool(torch.isfinite(x))
        row = x[0].numel() if x.shape[0] else 0
        if x.ndim > 1 and (x[0].is_contiguous() or row > CHUNK):
            return all(is_finite(r) for r in x)
        step = max(1, CHUNK // max(row, 1))
        return all(bool(torch.isfinite(x[s : s + step]).all()) for s in range(0, x.shape[0], step))
    flat = x.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, flat.numel(), CHUNK):
        total += flat[start : start + CHUNK].sum(dtype=torch.float64)
    return bool(torch.isfinite(total))


class CurvatureOperator(abc.ABC):
    """A symmetric ``dim x dim`` operator applied to blocks of k vectors stored as rows.

    Subclasses implement :meth:`_matmat_flat`; this base class validates shapes, counts
    matrix-vector products in :attr:`num_matvecs` (k per ``matmat`` call) and provides
    ``matvec``/``to_scipy``. ``space`` (a :class:`ParamSpace`) is present when the operator's
    coordinates are model parameters; it gives the flat slice of each parameter for per-block
    estimators.
    """

    space: ParamSpace | None = None
    #: where this rank's columns sit in the global vector when vectors are sharded over ranks: a
    #: ``losslens.geometry.base._linalg.ShardLayout``
    # (:class:`~losslens.geometry.operators.sharded.ShardedHessianOperator`);
    #: None: whole vectors
    layout = None
    num_matvecs: int = 0
    #: called with k after every product of k vectors (a progress display's ``update``; None: nothing)
    on_products: Callable[[int], Any] | None = None
    #: default memory budget of estimators on this operator (None: losslens.geometry.memory.budget.default_budget)
    max_memory: int | str | None = None

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Number of rows/columns."""

    @property
    @abc.abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abc.abstractmethod
    def device(self) -> torch.device: ...

    @property
    def param_dtype(self) -> torch.dtype:
        """dtype the products are computed in (``dtype`` unless the operator says otherwise)."""
        return self.dtype

    @property
    def product_eps(self) -> float:
        """Relative precision of one product: the machine epsilon of :attr:`param_dtype`."""
        return float(torch.finfo(self.param_dtype).eps)

    def pass_bytes(self, k: int, cached: bool | None = None, chunk: int | None = None) -> int:
        """Bytes one :meth:`matmat_flat` of k vectors allocates beyond its input and output
        (0 for an explicit matrix); operators with a graph override this."""
        return 0

    @contextlib.contextmanager
    def configured(
        self, chunk_size: int | None = None, cache_graphs: bool | None = None
    ) -> Iterator["CurvatureOperator"]:
        """Within the block, the settings of an estimator's memory plan (its ``operator_settings``):
        ``chunk_size`` (most vectors per pass) and ``cache_graphs`` (keep the gradient graphs between
        products); the previous settings are back at its end, however it ends. The subclass hook is
        :meth:`_configure` (default: no knobs, nothing to set)."""
        restore = self._configure(chunk_size, cache_graphs)
        try:
            yield self
        finally:
            restore()

    def _configure(self, chunk_size: int | None, cache_graphs: bool | None) -> Callable[[], None]:
        """Hook: apply the settings given (None: leave it) and return what restores the previous ones."""
        return lambda: None

    @abc.abstractmethod
    def _matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        """``V`` [k, dim] (validated) -> ``V @ H`` [k, dim] (H symmetric, so rows are H v_i)."""

    #: whether :meth:`refined_matmat_flat` may run products (an operator whose products are inexact):
    #: what an eigen solve's memory plan counts its final block for
    refines: bool = False

    def refined_matmat_flat(self, V: torch.Tensor) -> torch.Tensor | None:
        """More accurate products of a few vectors ``V`` [k, dim] (an eigen solve's Ritz vectors), or
        None where this operator's products are already as accurate as it can make them (every exact
        operator). Validated, counted and checked as :meth:`matmat_flat`; the subclass hook is
        :meth:`_refined_matmat_flat` (the gradient-difference backend: Richardson's stencil at half the
        central step, geometry/operators/difference.py "Eigenvalues"). Costs what those products cost."""
        out = self._refined_matmat_flat(self._block(V))
        return None if out is None else self._counted(out)

    def _refined_matmat_flat(self, V: torch.Tensor) -> torch.Tensor | None:
        """Hook: refined products of the validated ``V`` [k, dim], or None (the default: none)."""
        return None

    def matmat_flat(self, V: torch.Tensor) -> torch.Tensor:
        """Apply the operator to k flat vectors: ``V`` [k, dim] -> [k, dim]. Costs k matvecs."""
        return self._counted(self._matmat_flat(self._block(V)))

    def _block(self, V: torch.Tensor) -> torch.Tensor:
        """``V`` checked to be a non-empty ``[k, dim]`` block, on this operator's device and dtype."""
        if not isinstance(V, torch.Tensor) or V.ndim != 2:
            raise OperatorError(f"expected a [k, {self.dim}] tensor of row vectors, got {getattr(V, 'shape', type(V))}")
        if V.shape[0] == 0:
            raise OperatorError("k = 0: pass at least one vector")
        if V.shape[1] != self.dim:
            raise OperatorError(f"vectors have length {V.shape[1]}, the operator has dim {self.dim}")
        return V.to(device=self.device, dtype=self.dtype)

    def _counted(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the products of a block) counted in :attr:`num_matvecs`, reported to
        :attr:`on_products` and checked finite."""
        self.num_matvecs += out.shape[0]
        if self.on_products is not None:
            self.on_products(out.shape[0])
        if not is_finite(out):
            raise OperatorError("the operator returned NaN/Inf; check the loss and the model's weights")
        return out

    def matvec_flat(self, v: torch.Tensor) -> torch.Tensor:
        """One flat vector ``v`` [dim] -> ``H v`` [dim]. Costs one matvec."""
        if not isinstance(v, torch.Tensor) or v.ndim != 1:
            raise OperatorError(f"expected a [{self.dim}] vector, got {getattr(v, 'shape', type(v))}")
        return self.matmat_flat(v.unsqueeze(0))[0]

    def to_scipy(self):
        """This operator as a ``scipy.sparse.linalg.LinearOperator`` (float64 numpy in and out).

        scipy's column convention ``[dim, k]`` is transposed to rows internally. Each product is
        counted in :attr:`num_matvecs`.
        """
        from scipy.sparse.linalg import LinearOperator

        def mv(x):
            t = torch.as_tensor(np.asarray(x).reshape(-1), device=self.device, dtype=self.dtype)
            return self.matvec_flat(t).detach().cpu().double().numpy()

        def mm(X):
            t = torch.as_tensor(np.asarray(X).T.copy(), device=self.device, dtype=self.dtype)
            return self.matmat_flat(t).detach().cpu().double().numpy().T

        return LinearOperator((self.dim, self.dim), matvec=mv, rmatvec=mv, matmat=mm, rmatmat=mm, dtype=np.float64)

    def generator(self, seed: int) -> torch.Generator:
        """A ``torch.Generator`` on this operator's device seeded with ``seed`` (CPU generators
        are used for CUDA too, then moved, so numbers are identical across devices)."""
        g = torch.Generator(device="cpu")
        g.manual_seed(int(seed))
        return g

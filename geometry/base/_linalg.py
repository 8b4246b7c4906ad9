"""Row-block linear algebra for full-dim vectors, with no full-size temporaries.

Estimators hold their vectors as rows of ``[k, dim]`` tensors. At model scale (dim ≈ 1e8–1e10)
an expression like ``(V * HV).sum(1)`` or ``torch.linalg.qr(Y.T)`` allocates one or more extra
copies of the block; these helpers work column chunk by column chunk instead (temporaries of
``k × CHUNK`` numbers), accumulate reductions in float64, and orthonormalise in place.
A basis may live on another device than the vectors it acts on (``basis on host``): chunks of
it are moved as they are used.

Sharded vectors (docs/science.md §4, "Sharded vectors"): inside :func:`sharded_vectors` each row
holds only this rank's columns of the global vector (:class:`ShardLayout`), and the three reductions
here — :func:`rowdot` (hence :func:`row_norms`), :func:`residual_norms` and :func:`gram` (hence every
projection, orthonormalisation and basis operation) — sum their float64 partial results over the
ranks. Everything else acts column by column and needs no communication, so an estimator written on
these helpers runs unchanged on one device and on N ranks. Random rows come from
:func:`rademacher_rows` and :func:`gaussian_rows`, whose streams do not depend on how the columns are
split: a rank draws the global stream and keeps its columns, so sharded and unsharded runs see the
same vectors. Eigenpairs held as rows are ranked by :func:`magnitude_order` (``|λ|``, sign kept) and
reordered in place by :func:`permute_rows_` (one temporary row).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from losslens.geometry.base.state_store import DISK, state_rows


@dataclass(frozen=True)
class ShardLayout:
    """Where this rank's local columns sit in the global flat vector.

    ``ranges``: ``(global_start, length)`` of each run of local columns, in local column order and
    increasing global position; ``global_dim``: the length of the whole vector; ``reduce``: sums a
    CPU float64 tensor over the ranks (in place or not) and returns the sum. Local rows may be longer
    than ``Σ length`` (padding to a length shared by every rank): padding columns stay zero.
    """

    ranges: tuple[tuple[int, int], ...]
    global_dim: int
    reduce: Callable[[torch.Tensor], torch.Tensor]


_LAYOUT: contextvars.ContextVar[ShardLayout | None] = contextvars.ContextVar("losslens_shard_layout", default=None)


@contextlib.contextmanager
def sharded_vectors(layout: ShardLayout | None) -> Iterator[None]:
    """Within the block, rows are this rank's shards of ``layout`` (None: whole vectors)."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def current_layout() -> ShardLayout | None:
    """The :class:`ShardLayout` in force, or None (whole vectors)."""
    return _LAYOUT.get()


def _summed(t: torch.Tensor) -> torch.Tensor:
    layout = _LAYOUT.get()
    return t if layout is None else layout.reduce(t)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic dtype for stored rows: float32 for half-precision storage, else the dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


#: Numbers per temporary (2 Mi: 16 MB in float64): a chunk has CHUNK // rows columns.
CHUNK = 1 << 21


def spans(dim: int, rows: int = 1):
    step = max(4096, CHUNK // max(1, rows))
    for start in range(0, dim, step):
        yield slice(start, min(start + step, dim))


def power_sums(x: torch.Tensor, scale: float = 1.0) -> tuple[float, float]:
    """``(Σ (x/scale)², Σ (x/scale)⁴)`` over every entry of ``x``, in float64, :data:`CHUNK`
    entries at a time (``x.sum(dtype=torch.float64)`` would first cast all of ``x`` on CPU).
    Temporaries: one float64 chunk (16.8 MB); one host synchronisation. Local: no sum over ranks."""
    flat = x.reshape(-1)  # a view for contiguous x
    s2 = torch.zeros((), dtype=torch.float64, device=x.device)
    s4 = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, flat.numel(), CHUNK):
        q = flat[start : start + CHUNK].to(torch.float64, copy=True)
        if scale != 1.0:
            q.div_(scale)
        s2 += q.square_().sum()
        s4 += q.square_().sum()
        del q  # before the next chunk's copy
    return float(s2), float(s4)


def rowdot(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``[k]`` float64 (CPU): ``Σ_j A[i, j] · B[i, j]`` for each row i of two ``[k, dim]`` tensors."""
    out = torch.zeros(A.shape[0], dtype=torch.float64)
    for s in spans(A.shape[1], A.shape[0]):
        a = A[:, s].to(torch.float64)
        b = B[:, s].to(device=a.device, dtype=torch.float64)
        out += (a * b).sum(dim=1).cpu()
    return _summed(out)


def row_norms(A: torch.Tensor) -> torch.Tensor:
    """``[k]`` float64 Euclidean norms of the rows of ``A``."""
    return rowdot(A, A).sqrt()


def residual_norms(A: torch.Tensor, B: torch.Tensor, scale) -> torch.Tensor:
    """``[k]`` float64 norms ``‖A_i − scale_i · B_i‖`` for ``[k, dim]`` A, B (e.g. ``‖Hv − λv‖``),
    accumulated chunk by chunk in float64 (no cancellation, no full-size copy)."""
    lam = torch.as_tensor(scale, dtype=torch.float64).reshape(-1, 1)
    out = torch.zeros(A.shape[0], dtype=torch.float64)
    for s in spans(A.shape[1], 2 * A.shape[0]):
        a = A[:, s].to(torch.float64)
        d = a - lam.to(a.device) * B[:, s].to(device=a.device, dtype=torch.float64)
        out += (d * d).sum(dim=1).cpu()
        del a, d  # before the next chunk's: float64 rows then hold one chunk (two halves) at most
    return _summed(out).sqrt()


def gram(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B.T`` as float64 ``[a, b]`` (CPU), accumulated over column chunks (products of each
    chunk in the inputs' dtype, at least float32)."""
    out = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64)
    dt = _compute_dtype(A.dtype)
    for s in spans(A.shape[1], A.shape[0] + B.shape[0]):
        a = A[:, s].to(dt)
        b = B[:, s].to(device=a.device, dtype=dt)
        out += (a @ b.T).to(torch.float64).cpu()
    return _summed(out)


def _stream_rows(k: int, dim: int, draw: Callable[[int], torch.Tensor], dtype: torch.dtype, device) -> torch.Tensor:
    """``[k, dim]`` rows from a sequential stream ``draw(n) -> [n]`` (float64 or int8) whose numbers do
    not depend on how many are drawn per call, drawn :data:`CHUNK` numbers at a time (temporaries of
    one chunk); sharded: this rank's columns of each global row (the other columns drawn and dropped)."""
    layout = _LAYOUT.get()
    ranges, total = (((0, dim),), dim) if layout is None else (layout.ranges, layout.global_dim)
    out = torch.zeros(k, dim, dtype=dtype, device=device)

    def skip(n: int) -> None:
        while n > 0:
            m = min(n, CHUNK)
            draw(m)
            n -= m

    for i in range(k):
        pos = col = 0
        for start, length in ranges:
            skip(start - pos)
            for s in range(0, length, CHUNK):
                m = min(CHUNK, length - s)
                out[i, col + s : col + s + m] = draw(m).to(device=device, dtype=dtype)
            col, pos = col + length, start + length
        skip(total - pos)
    return out


def rademacher_rows(generator: torch.Generator, k: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[k, dim]`` i.i.d. ±1 entries from a CPU ``generator`` (int8 draws: the same numbers however
    the rows or columns are split), cast to ``dtype`` on ``device``; sharded: this rank's columns."""
    bits = _stream_rows(
        k, dim, lambda n: torch.randint(0, 2, (n,), generator=generator, dtype=torch.int8), torch.int8, device
    )
    out = bits.to(dtype=dtype).mul_(2).sub_(1)
    layout = _LAYOUT.get()
    if layout is not None and sum(n for _, n in layout.ranges) < dim:
        out[:, sum(n for _, n in layout.ranges) :] = 0  # padding stays zero
    return out


def gaussian_rows(generator: torch.Generator, k: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[k, dim]`` i.i.d. standard normal entries from a CPU ``generator``: z = √2·erfinv(2u − 1)
    of uniform float64 draws u ∈ (0, 1) (one draw per number, so the stream does not depend on how
    the rows or columns are split, unlike ``torch.randn``); sharded: this rank's columns."""
    tiny = 2.0**-53

    def draw(n: int) -> torch.Tensor:
        u = torch.rand(n, generator=generator, dtype=torch.float64).mul_(1 - 2 * tiny).add_(tiny)
        return torch.special.erfinv(u.mul_(2).sub_(1)).mul_(math.sqrt(2.0))

    return _stream_rows(k, dim, draw, dtype, device)


def gaussian_unit(generator: torch.Generator, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A Gaussian unit vector ``[dim]``: one row of :func:`gaussian_rows` drawn on the CPU in ``dtype``
    (chunk by chunk: no float64 copy at model scale; sharded: this rank's columns of the global
    vector, normalised by the global norm), then moved to ``device``."""
    x = gaussian_rows(generator, 1, dim, dtype, "cpu")
    x /= float(row_norms(x)[0])
    return x[0].to(device=device)


def combine_into(out: torch.Tensor, C: torch.Tensor, B: torch.Tensor, alpha: float = 1.0, beta: float = 1.0) -> None:
    """In place: ``out = beta · out + alpha · C @ B`` for ``out`` [a, dim], ``C`` [a, b], ``B`` [b, dim]
    (``B`` may live on another device), chunk by chunk."""
    dt = _compute_dtype(out.dtype)
    Cd = C.to(device=out.device, dtype=dt)
    for s in spans(out.shape[1], out.shape[0] + B.shape[0]):
        b = B[:, s].to(device=out.device, dtype=dt)
        if dt == out.dtype:
            out[:, s].mul_(beta).addmm_(Cd, b, alpha=alpha)
        else:
            out[:, s] = torch.addmm(out[:, s].to(dt), Cd, b, beta=beta, alpha=alpha).to(out.dtype)


def project_out(X: torch.Tensor, Q: torch.Tensor, passes: int = 2) -> None:
    """In place: ``X ← X − (X Qᵀ) Q`` for orthonormal rows ``Q`` [r, dim], ``passes`` times
    (classical Gram–Schmidt twice: orthogonal to working precision)."""
    if Q.shape[0] == 0:
        return
    for _ in range(passes):
        C = gram(X, Q)
        combine_into(X, C, Q, alpha=-1.0)


def transform_rows(Y: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """In place: the first ``r`` rows of ``Y`` [s, dim] become ``M @ Y`` for ``M`` [r, s] (r ≤ s);
    returns the view ``Y[:r]``. Temporaries: ``r × CHUNK`` numbers."""
    r = M.shape[0]
    dt = _compute_dtype(Y.dtype)
    Md = M.to(device=Y.device, dtype=dt)
    for s in spans(Y.shape[1], Y.shape[0] + r):
        block = Md @ Y[:, s].to(dt)
        Y[:r, s].copy_(block)
    return Y[:r]


def orthonormalize_rows(Y: torch.Tensor, rtol: float | None = None, passes: int = 2) -> torch.Tensor:
    """Orthonormal basis of the row space of ``Y`` [s, dim], computed in place; returns ``Y[:r]``.

    Each pass forms the Gram matrix G = Y Yᵀ in float64, diagonalises it (G = U Λ Uᵀ), drops the
    directions with ``λ ≤ rtol · λ_max`` (numerically dependent rows; default ``rtol = s · eps``
    of Y's dtype: a singular value below √rtol of the largest is rounding noise), and replaces the rows by
    ``Λ^{-1/2} Uᵀ Y``. Two passes make
    the rows orthonormal to working precision even when Y is ill-conditioned (the second pass
    starts from a Gram matrix close to I). Cost per pass: s² · dim multiply-adds.
    """
    if rtol is None:
        rtol = Y.shape[0] * float(torch.finfo(Y.dtype).eps)
    out = Y
    for _ in range(passes):
        if out.shape[0] == 0:
            return out
        G = gram(out, out).numpy()
        lam, U = np.linalg.eigh(G)
        lmax = float(lam.max()) if lam.size else 0.0
        if not lmax > 0:
            return out[:0]
        keep = lam > rtol * lmax
        order = np.argsort(-lam[keep])
        lam_k, U_k = lam[keep][order], U[:, keep][:, order]
        M = torch.as_tensor((U_k / np.sqrt(lam_k)).T.copy())  # [r, s]
        out = transform_rows(out, M)
    return out


class RowBasis:
    """Orthonormal rows stored in blocks (no storage beyond what is used), on any device and in any
    dtype (a basis on the host, or in bfloat16, acting on vectors elsewhere).

    Blocks hold :meth:`block_rows` rows: 16 for small vectors, fewer as rows grow, one row at a
    time once a row exceeds 4 MB, so at most 64 MB sit allocated but unused.
    Memory: :meth:`allocated_rows` ``(n) · dim`` numbers of ``dtype`` on ``device``: a torch device, or
    ``"disk"`` (:mod:`losslens.geometry.base.state_store`: memory-mapped, used as CPU tensors); ``pin``:
    host blocks page-locked (an operator on a GPU).
    """

    @staticmethod
    def block_rows(dim: int, dtype: torch.dtype) -> int:
        """Rows per storage block for vectors of ``dim`` numbers of ``dtype``."""
        row = dim * torch.empty((), dtype=dtype).element_size()
        return int(max(1, min(16, (1 << 26) // max(row, 1))))

    @staticmethod
    def allocated_rows(n: int, dim: int, dtype: torch.dtype) -> int:
        """Rows allocated to hold ``n`` rows (a whole number of blocks)."""
        b = RowBasis.block_rows(dim, dtype)
        return -(-n // b) * b

    def __init__(self, dim: int, dtype: torch.dtype, device, pin: bool = False):
        self.where, self.pin = device, pin
        self.dim, self.dtype = dim, dtype
        self.device = torch.device("cpu") if device == DISK else torch.device(device)
        self.BLOCK = self.block_rows(dim, dtype)
        self.blocks: list[torch.Tensor] = []
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def row(self, i: int) -> torch.Tensor:
        return self.blocks[i // self.BLOCK][i % self.BLOCK]

    def append(self, v: torch.Tensor) -> None:
        if self.n == len(self.blocks) * self.BLOCK:
            self.blocks.append(state_rows(self.BLOCK, self.dim, self.dtype, self.where, self.pin))
        self.row(self.n).copy_(v)
        self.n += 1

    def views(self) -> list[torch.Tensor]:
        """The used rows as a list of [≤16, dim] views."""
        out, left = [], self.n
        for b in self.blocks:
            if left <= 0:
                break
            out.append(b[: min(left, self.BLOCK)])
            left -= self.BLOCK
        return out

    def orthogonalize(self, w: torch.Tensor, passes: int = 2) -> np.ndarray:
        """In place: remove from ``w`` [1, dim] its components along the basis, ``passes`` times;
        returns the float64 projection coefficients Qᵀw summed over the passes."""
        coef = np.zeros(self.n)
        for _ in range(passes):
            start = 0
            for B in self.views():
                c = gram(w, B)  # [1, rows] float64
                coef[start : start + B.shape[0]] += c[0].numpy()
                combine_into(w, c, B, alpha=-1.0)
                start += B.shape[0]
        return coef

    def keep_combinations(self, M: np.ndarray) -> None:
        """Replace the basis by the ``r`` rows ``M @ Q`` (M [r, n], r ≤ n), in place
        (temporaries: ``(n + r) × chunk`` numbers)."""
        r = M.shape[0]
        dt = _compute_dtype(self.dtype)
        Md = torch.as_tensor(M).to(device=self.device, dtype=dt)
        views = self.views()
        for s in spans(self.dim, self.n + r):
            X = torch.cat([B[:, s] for B in views]).to(dt)  # [n, chunk]
            Y = Md @ X
            for i in range(r):
                self.row(i)[s].copy_(Y[i])
        self.n = r
        self.blocks = self.blocks[: (r + self.BLOCK - 1) // self.BLOCK + 1]

    def combine(self, M: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
        """A new ``[r, dim]`` tensor ``M @ Q`` (M [r, n]) of ``dtype`` on ``device``."""
        out = torch.zeros(M.shape[0], self.dim, dtype=dtype, device=device)
        start = 0
        for B in self.views():
            combine_into(out, torch.as_tensor(M[:, start : start + B.shape[0]].copy()), B)
            start += B.shape[0]
        return out


def magnitude_order(values) -> np.ndarray:
    """Indices that rank ``values`` by magnitude, largest first (ties: larger value first), stable."""
    v = np.asarray(values, dtype=float)
    return np.lexsort((-v, -np.abs(v)))


def permute_rows_(F: torch.Tensor, order: list[int]) -> None:
    """``F[:] = F[order]`` in place, through one temporary row (cycle by cycle)."""
    tmp, placed = None, set()
    for start in range(len(order)):
        if start in placed or order[start] == start:
            continue
        tmp = F[start].clone() if tmp is None else tmp.copy_(F[start])
        i = start
        while True:
            placed.add(i)
            j = order[i]
            if j == start:
                F[i].copy_(tmp)
                break
            F[i].copy_(F[j])
            i = j

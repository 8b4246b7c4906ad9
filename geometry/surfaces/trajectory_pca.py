"""The plane of a whole trajectory: principal components of N checkpoints (docs/science.md §5.4).

Li et al. (2018) draw an optimisation path on the plane of its top two principal components. With
N checkpoints θ_1..θ_N of P parameters (N ≪ P) and a centre c (their mean, or one checkpoint), the
centred matrix X = [θ_i − c] (N × P) is never formed: its Gram matrix G = X Xᵀ (N × N) is summed
in float64 one tensor-slice at a time over all N checkpoints, G = U Λ Uᵀ gives the principal axes
e_j = Xᵀ u_j / σ_j (σ_j = √λ_j, unit-norm and orthogonal) and the coordinates x_ij = σ_j u_ij,
exactly the right singular vectors and scores of a float64 SVD of X.

- **Signs** are fixed so that the entry of largest magnitude of each u_j is positive (ties: the
  lowest checkpoint index): the same checkpoints give the same figure on every run.
- **Explained variance ratio** of axis j: λ_j / Σ_all λ (Σ λ = Σ_i ‖θ_i − c‖²).
- **Residuals**: a checkpoint's distance from the plane of two axes a, b is
  √(Σ_{j∉{a,b}} λ_j u_ij²) (from the full decomposition, no cancellation); divided by ‖θ_i − c‖ it
  says whether the point's place on the plane means anything (0: on the plane; 1: orthogonal).
- **Further points** (a quantized Θ̂, a LAWA checkpoint) are projected with
  :meth:`~losslens.geometry.surfaces.trajectory_axes.TrajectoryPCA.project`: coordinates (θ − c)·e_j, and the
  same residual.
- **Filter normalisation** (optional, as in :func:`~losslens.geometry.surfaces.random_planes.random_plane`): each
  axis is rescaled row by row to the centre's row norms after the PCA; the axes are then no longer
  orthonormal, coordinates are the least-squares coefficients on the chosen pair of axes, and the
  residuals are those of that least-squares fit (one more pass).

Cost: two passes over all N checkpoints (three with filter normalisation), reading each tensor in
row-slices of at most ``chunk_elements`` numbers from every source at once. Memory
(:func:`estimate_memory`, checked before any read): the centre and k axes as dicts of the model's
size in float32 (the checkpoints' dtype when wider), G and U (N² float64 each), and the slices:
three float64 ``[N, chunk_elements]`` matrices.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from losslens.geometry.base.params import ParamGlobs, iter_names
from losslens.geometry.memory.model import MemoryEstimate, first_fitting
from losslens.geometry.memory.budget import resolve_budget
from losslens.geometry.surfaces.random_planes import _filter_normalize_
from losslens.geometry.surfaces.sources import PointSource, as_rows, as_source, chunk_rows, row_count
from losslens.geometry.surfaces.trajectory_axes import CHUNK_ELEMENTS, TrajectoryPCA, TrajectoryPCAError, _check_same

__all__ = ["trajectory_pca", "estimate_memory"]


def _storage_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def estimate_memory(
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, torch.dtype],
    n_points: int,
    k: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
    max_memory: int | str | None = None,
    held_bytes: int = 0,
) -> MemoryEstimate:
    """Memory of :func:`trajectory_pca` over ``n_points`` checkpoints with tensors of ``shapes``:
    the centre and ``k`` axes (float32, or the checkpoints' dtype when wider), G and U (N² float64
    each), three float64 ``[N, chunk]`` slice matrices, and ``held_bytes`` that sources hold whole
    (a source's ``held_bytes`` attribute, e.g. torch-file checkpoints). Raises
    :class:`~losslens.geometry.memory.budget.MemoryBudgetError` when over ``max_memory`` (default: the host's
    default budget)."""
    vec = sum(int(np.prod(s)) * _storage_dtype(dtypes[n]).itemsize for n, s in shapes.items())
    chunk = max(min(chunk_elements, max(int(np.prod(s)) if s else 1, 1)) for s in shapes.values())
    parts = {
        f"centre and {k} axes ({k + 1} model-size dicts)": (k + 1) * vec,
        "Gram matrix and eigenvectors (2 N² float64)": 2 * n_points * n_points * 8,
        "slices (3 [N, chunk] float64)": 3 * n_points * chunk * 8,
    }
    if held_bytes:
        parts["points held whole by their sources"] = int(held_bytes)
    est = MemoryEstimate(parts, resolve_budget(max_memory, "cpu"), {"chunk_elements": int(chunk_elements), "k": k})
    return first_fitting(
        [est],
        f"the principal axes of {n_points} checkpoints",
        "select fewer tensors (params=...), use fewer axes, or raise max_memory",
    )


def _stream(
    names, sources, step, visit: Callable[[str, int, int, torch.Tensor], None], progress: Callable[[str], None] | None
) -> None:
    """Call ``visit(name, lo, hi, X)`` with X the ``[N, m]`` float64 stack of rows lo:hi of every source."""
    for name in names:
        shape = tuple(sources[0].shape(name))
        per = chunk_rows(shape, step)
        for lo in range(0, row_count(shape), per):
            hi = min(row_count(shape), lo + per)
            x = torch.stack([s.rows(name, lo, hi).to(torch.float64).reshape(-1) for s in sources])
            visit(name, lo, hi, x)
        if progress is not None:
            progress(name)


def trajectory_pca(
    points: Sequence[PointSource | Mapping[str, torch.Tensor]],
    k: int = 2,
    center: str | int = "mean",
    params: ParamGlobs = None,
    filter_normalize: bool = False,
    ignore: Sequence[str] = ("bias", "norm"),
    one_d: str = "zero",
    labels: Sequence[str] | None = None,
    max_memory: int | str | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    progress: Callable[[str], None] | None = None,
) -> TrajectoryPCA:
    """Top-``k`` principal axes of ``points`` (N ≥ k + 1 checkpoints of one architecture).

    Parameters
    ----------
    points : N point sources (:class:`~losslens.geometry.surfaces.sources.PointSource`) or dicts of tensors.
    k : number of axes (≥ 2; at most the rank of the centred checkpoints, ≤ N − 1).
    center : ``"mean"`` or the index / label of the checkpoint used as centre.
    params : globs selecting the floating-point tensors that span the space (default: all).
    filter_normalize : after the PCA, rescale the axes row by row to the centre's row norms.
    ignore, one_d : the rules of that rescaling, as in
        :func:`~losslens.geometry.surfaces.random_planes.filter_normalize`.
    labels : the points' labels (default: each source's ``label``).
    max_memory : budget of :func:`estimate_memory`, checked before any read.
    chunk_elements : numbers per slice read from each source.
    progress : called with each tensor name when its slices are done (a progress bar's update).

    Returns
    -------
    TrajectoryPCA
        Cost: 2 passes over every point (3 when filter-normalised).
    """
    if labels is not None and len(labels) != len(points):
        raise TrajectoryPCAError(f"got {len(labels)} labels for {len(points)} points")
    sources = [as_source(p, f"point-{i}") for i, p in enumerate(points)]
    n, k = len(sources), int(k)
    if k < 2:
        raise TrajectoryPCAError(f"k must be at least 2 (a plane needs two axes), got {k}")
    if n < k + 1:
        raise TrajectoryPCAError(
            f"{n} checkpoints span at most {n - 1} axes around their centre; k={k} needs at least {k + 1}"
        )
    all_names = [nm for nm in sources[0].names() if sources[0].dtype(nm).is_floating_point]
    names = iter_names(all_names, params)
    if not names:
        raise TrajectoryPCAError(f"no floating-point parameter matches params={params!r}")
    _check_same(names, sources)
    labs = [str(v) for v in labels] if labels is not None else [s.label for s in sources]
    if len(set(labs)) != n:
        raise TrajectoryPCAError(f"point labels must be unique, got {labs}")
    if isinstance(center, str) and center != "mean":
        if center not in labs:
            raise TrajectoryPCAError(f"center {center!r} is neither 'mean' nor one of the labels {labs}")
        center = labs.index(center)
    if not isinstance(center, str) and not 0 <= int(center) < n:
        raise TrajectoryPCAError(f"center index {center} is outside 0..{n - 1}")
    shapes = {nm: tuple(sources[0].shape(nm)) for nm in names}
    dtypes = {nm: sources[0].dtype(nm) for nm in names}
    estimate_memory(
        shapes, dtypes, n, k, chunk_elements, max_memory, sum(int(getattr(s, "held_bytes", 0)) for s in sources)
    )

    # pass 1: the centre and G = X Xᵀ
    ctr = {nm: torch.empty(shapes[nm], dtype=_storage_dtype(dtypes[nm])) for nm in names}
    gram = torch.zeros(n, n, dtype=torch.float64)

    def centre_of(x: torch.Tensor) -> torch.Tensor:  # float64, recomputed identically in every pass
        return x.mean(0) if center == "mean" else x[int(center)].clone()

    def centre_and_gram(name, lo, hi, x):
        c = centre_of(x)
        as_rows(ctr[name])[lo:hi] = c.reshape(hi - lo, -1).to(ctr[name].dtype)
        x -= c
        gram.add_(x @ x.T)

    _stream(names, sources, chunk_elements, centre_and_gram, progress)
    lam, u = torch.linalg.eigh(gram)
    lam, u = lam.flip(0).numpy(), u.flip(1).numpy()
    lam[lam <= n * np.finfo(np.float64).eps * max(lam[0], 0.0)] = 0.0  # numerical zeros (rank < N) are zeros
    idx = np.argmax(np.abs(u), axis=0)  # sign rule: the largest |u_ij| of each axis > 0
    u = u * np.where(u[idx, np.arange(n)] < 0, -1.0, 1.0)
    total = float(np.clip(lam, 0, None).sum())
    if lam[k - 1] <= 0:
        rank = int((lam > 0).sum())
        raise TrajectoryPCAError(
            f"the {n} checkpoints span {rank} independent direction(s) around their centre; "
            f"k={k} axes need {k}: use fewer axes or checkpoints that differ"
        )
    sigma = np.sqrt(lam[:k])

    # pass 2: the axes e_j = Xᵀ u_j / σ_j
    axes = [{nm: torch.empty(shapes[nm], dtype=_storage_dtype(dtypes[nm])) for nm in names} for _ in range(k)]
    proj = torch.from_numpy((u[:, :k] / sigma).T.copy())  # [k, N]

    def directions(name, lo, hi, x):
        x -= centre_of(x)
        e = proj @ x
        for j in range(k):
            as_rows(axes[j][name])[lo:hi] = e[j].reshape(hi - lo, -1).to(axes[j][name].dtype)

    _stream(names, sources, chunk_elements, directions, progress)
    meta = {
        "filter_normalize": bool(filter_normalize),
        "params": params,
        "chunk_elements": int(chunk_elements),
        "sign_rule": "largest |entry| of each eigenvector positive (ties: lowest index)",
        "total_variance": total,
    }
    out = TrajectoryPCA(
        ctr,
        axes,
        labs,
        u[:, :k] * sigma,
        sigma,
        lam[:k] / total,
        lam,
        u,
        "mean" if center == "mean" else labs[int(center)],
        meta,
    )
    if filter_normalize:
        for d in axes:
            _filter_normalize_(d, ctr, ignore, one_d, 1e-10)
        out.meta.update(ignore=list(ignore), one_d=one_d)
        _least_squares_fit(out, names, sources, chunk_elements, progress, centre_of)
    return out


def _least_squares_fit(out: TrajectoryPCA, names, sources, step, progress, centre_of) -> None:
    """Coordinates and residuals on filter-normalised (non-orthogonal) axes: pass 3."""
    n, k = len(sources), out.k
    dots, gram_e = torch.zeros(n, k, dtype=torch.float64), torch.zeros(k, k, dtype=torch.float64)

    def visit(name, lo, hi, x):
        x -= centre_of(x)
        e = torch.stack([as_rows(d[name])[lo:hi].to(torch.float64).reshape(-1) for d in out.directions])
        dots.add_(x @ e.T)
        gram_e.add_(e @ e.T)

    _stream(names, sources, step, visit, progress)
    dots_np, ge = dots.numpy(), gram_e.numpy()
    dist2 = out.distances**2
    out.coords = np.zeros((n, k))
    for a in range(k):
        for b in range(a + 1, k):
            pair = np.array([a, b])
            sub = ge[np.ix_(pair, pair)]
            xy = np.linalg.solve(sub, dots_np[:, pair].T).T  # [N, 2]
            res2 = dist2 - 2 * np.sum(xy * dots_np[:, pair], 1) + np.einsum("ij,jk,ik->i", xy, sub, xy)
            out._fit[(a, b)] = (xy, np.sqrt(np.clip(res2, 0, None)))
            out._fit[(b, a)] = (xy[:, ::-1].copy(), out._fit[(a, b)][1])
    out.coords[:, :2] = out._fit[(0, 1)][0]
    for j in range(2, k):
        out.coords[:, j] = out._fit[(0, j)][0][:, 1]

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
  :meth:`TrajectoryPCA.project`: coordinates (θ − c)·e_j, and the same residual.
- **Filter normalisation** (optional, as in :func:`~geometry.surfaces.random_planes.random_plane`): each
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

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..base.params import ParamGlobs, iter_names
from ..memory.model import MemoryEstimate, first_fitting, resolve_budget
from .planes import Plane, PlaneError
from .random_planes import _filter_normalize_
from .sources import PointSource, as_source, chunk_rows, row_count

__all__ = ["TrajectoryPCA", "ProjectedPoint", "TrajectoryPCAError", "trajectory_pca", "estimate_memory"]

#: Numbers per slice read from each source (1 Mi: 8 MB of float64 per checkpoint).
CHUNK_ELEMENTS = 1 << 20


class TrajectoryPCAError(PlaneError):
    """The checkpoints cannot give the asked principal components (too few, equal, mismatched)."""


@dataclass
class ProjectedPoint:
    """A point projected onto the trajectory's axes.

    Attributes
    ----------
    label : the point's name.
    coords : ``[k]`` coordinates on the axes (parameter-space units).
    distance : ‖θ − c‖, its distance from the centre.
    residual : its distance from the plane of ``axes``.
    axes : the pair of axes the residual refers to.
    """

    label: str
    coords: np.ndarray
    distance: float
    residual: float
    axes: tuple[int, int] = (0, 1)

    @property
    def relative_residual(self) -> float:
        """residual / distance (0 for the centre itself): how far off the plane, as a fraction."""
        return float(self.residual / self.distance) if self.distance > 0 else 0.0

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "coords": [float(v) for v in self.coords], "distance": float(self.distance),
                "residual": float(self.residual), "relative_residual": self.relative_residual,
                "axes": list(self.axes)}


@dataclass
class TrajectoryPCA:
    """Principal axes of a set of checkpoints (see the module docstring for every definition).

    Attributes
    ----------
    center : ``{name: Tensor}`` the centre c (float32 or wider).
    directions : k dicts, the axes e_1..e_k (unit-norm and orthogonal unless filter-normalised).
    labels : the N checkpoints' labels, in the order given.
    coords : ``[N, k]`` float64 coordinates of the checkpoints.
    singular_values : ``[k]`` σ_j; ``explained_variance_ratio`` : ``[k]`` λ_j / Σ λ.
    eigenvalues : ``[N]`` all λ of G (descending), ``eigenvectors`` : ``[N, N]`` U (sign-fixed).
    center_label : ``"mean"`` or the label of the checkpoint used as centre.
    meta : settings (filter normalisation, parameter globs, slice size, sign rule).
    """

    center: dict[str, torch.Tensor]
    directions: list[dict[str, torch.Tensor]]
    labels: list[str]
    coords: np.ndarray
    singular_values: np.ndarray
    explained_variance_ratio: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    center_label: str = "mean"
    meta: dict[str, Any] = field(default_factory=dict)
    _fit: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def k(self) -> int:
        return len(self.directions)

    @property
    def distances(self) -> np.ndarray:
        """``[N]`` ‖θ_i − c‖."""
        lam = np.clip(self.eigenvalues, 0.0, None)
        return np.sqrt(np.clip((self.eigenvectors ** 2) @ lam, 0.0, None))

    def plane_coords(self, axes: tuple[int, int] = (0, 1)) -> np.ndarray:
        """``[N, 2]`` the checkpoints' coordinates on the plane of ``axes``."""
        if axes in self._fit:
            return self._fit[axes][0]
        return self.coords[:, list(axes)]

    def residuals(self, axes: tuple[int, int] = (0, 1)) -> np.ndarray:
        """``[N]`` each checkpoint's distance from the plane of ``axes``."""
        if axes in self._fit:
            return self._fit[axes][1]
        keep = np.ones(len(self.eigenvalues), bool)
        keep[list(axes)] = False
        lam = np.clip(self.eigenvalues, 0.0, None) * keep
        return np.sqrt(np.clip((self.eigenvectors ** 2) @ lam, 0.0, None))

    def plane(self, axes: tuple[int, int] = (0, 1), points: Sequence[ProjectedPoint] = ()) -> Plane:
        """The :class:`~geometry.surfaces.planes.Plane` c + x·e_a + y·e_b, its marked points the
        checkpoints (and ``points``). Shares the centre and axes (no copy)."""
        a, b = _check_axes(axes, self.k)
        xy = self.plane_coords((a, b))
        coords = {lab: (float(x), float(y)) for lab, (x, y) in zip(self.labels, xy)}
        for p in points:
            coords[p.label] = (float(p.coords[a]), float(p.coords[b]))
        norms = {f"explained variance PC{j + 1}": float(r) for j, r in enumerate(self.explained_variance_ratio)}
        return Plane(origin=self.center, e1=self.directions[a], e2=self.directions[b], coords=coords, norms=norms,
                     kind="trajectory-pca", scale=float(max(self.singular_values[a], 1e-12)),
                     meta={**self.meta, "axes": [a, b], "center": self.center_label})

    def project(self, point: PointSource | Mapping[str, torch.Tensor], label: str | None = None,
                axes: tuple[int, int] = (0, 1)) -> ProjectedPoint:
        """Coordinates of ``point`` on every axis and its residual from the plane of ``axes``.
        Cost: one pass over the point (one slice at a time, float64)."""
        a, b = _check_axes(axes, self.k)
        src = as_source(point, label)
        names = list(self.center)
        _check_same(names, [src], self.center)
        step = int(self.meta.get("chunk_elements", CHUNK_ELEMENTS))
        dots, dd, gram = np.zeros(self.k), 0.0, np.zeros((self.k, self.k))
        for name in names:
            shape = tuple(self.center[name].shape)
            rows = row_count(shape)
            c_rows = _rows(self.center[name])
            d_rows = [_rows(d[name]) for d in self.directions]
            for lo in range(0, rows, chunk_rows(shape, step)):
                hi = min(rows, lo + chunk_rows(shape, step))
                diff = src.rows(name, lo, hi).to(torch.float64) - c_rows[lo:hi].to(torch.float64)
                e = torch.stack([d[lo:hi].to(torch.float64).reshape(-1) for d in d_rows])
                dots += (e @ diff.reshape(-1)).numpy()
                gram += (e @ e.T).numpy()
                dd += float(diff.reshape(-1) @ diff.reshape(-1))
        if self.meta.get("filter_normalize"):
            pair = np.array([a, b])
            sub = gram[np.ix_(pair, pair)]
            xy = np.linalg.solve(sub, dots[pair])
            coords = np.zeros(self.k)
            coords[pair] = xy
            res2 = dd - 2 * xy @ dots[pair] + xy @ sub @ xy
        else:
            coords = dots
            res2 = dd - dots[a] ** 2 - dots[b] ** 2
        return ProjectedPoint(src.label, coords, float(np.sqrt(max(dd, 0.0))), float(np.sqrt(max(res2, 0.0))), (a, b))

    def describe(self, axes: tuple[int, int] = (0, 1)) -> dict[str, Any]:
        """JSON-ready summary: explained variance ratios, every checkpoint's coordinates and residual."""
        res, dist = self.residuals(axes), self.distances
        return {
            "k": self.k, "n_checkpoints": len(self.labels), "center": self.center_label, "axes": list(axes),
            "explained_variance_ratio": [float(v) for v in self.explained_variance_ratio],
            "singular_values": [float(v) for v in self.singular_values],
            "checkpoints": [{"label": lab, "coords": [float(v) for v in self.coords[i]],
                             "plane_coords": [float(v) for v in self.plane_coords(axes)[i]],
                             "distance": float(dist[i]), "residual": float(res[i]),
                             "relative_residual": float(res[i] / dist[i]) if dist[i] > 0 else 0.0}
                            for i, lab in enumerate(self.labels)],
            "meta": {k: v for k, v in self.meta.items()},
        }


def _check_axes(axes: Sequence[int], k: int) -> tuple[int, int]:
    a, b = (int(v) for v in axes)
    if a == b or not (0 <= a < k and 0 <= b < k):
        raise TrajectoryPCAError(f"axes must be two different indices below k={k}, got {tuple(axes)}")
    return a, b


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, 1) if t.ndim == 0 else t.reshape(t.shape[0], -1)


def _check_same(names: Sequence[str], sources: Sequence[PointSource], ref: Mapping[str, torch.Tensor] | None = None):
    first = sources[0] if ref is None else None
    for src in sources:
        have = set(src.names())
        missing = [n for n in names if n not in have]
        if missing:
            raise TrajectoryPCAError(f"point {src.label!r} lacks parameters {missing[:4]}: all points must come "
                                     "from one architecture")
        for n in names:
            want = tuple(ref[n].shape) if ref is not None else first.shape(n)
            if tuple(src.shape(n)) != want:
                raise TrajectoryPCAError(f"parameter {n!r} has shape {tuple(src.shape(n))} in {src.label!r} but "
                                         f"{want} elsewhere: different architectures cannot share a plane")


def _storage_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def estimate_memory(shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype], n_points: int,
                    k: int = 2, chunk_elements: int = CHUNK_ELEMENTS, max_memory: int | str | None = None,
                    held_bytes: int = 0) -> MemoryEstimate:
    """Memory of :func:`trajectory_pca` over ``n_points`` checkpoints with tensors of ``shapes``:
    the centre and ``k`` axes (float32, or the checkpoints' dtype when wider), G and U (N² float64
    each), three float64 ``[N, chunk]`` slice matrices, and ``held_bytes`` that sources hold whole
    (a source's ``held_bytes`` attribute, e.g. torch-file checkpoints). Raises
    :class:`~geometry.memory.model.MemoryBudgetError` when over ``max_memory`` (default: the host's
    default budget)."""
    vec = sum(int(np.prod(s)) * _storage_dtype(dtypes[n]).itemsize for n, s in shapes.items())
    chunk = max(min(chunk_elements, max(int(np.prod(s)) if s else 1, 1)) for s in shapes.values())
    parts = {f"centre and {k} axes ({k + 1} model-size dicts)": (k + 1) * vec,
             "Gram matrix and eigenvectors (2 N² float64)": 2 * n_points * n_points * 8,
             "slices (3 [N, chunk] float64)": 3 * n_points * chunk * 8}
    if held_bytes:
        parts["points held whole by their sources"] = int(held_bytes)
    est = MemoryEstimate(parts, resolve_budget(max_memory, "cpu"), {"chunk_elements": int(chunk_elements), "k": k})
    return first_fitting([est], f"the principal axes of {n_points} checkpoints",
                         "select fewer tensors (params=...), use fewer axes, or raise max_memory")


def _stream(names, sources, step, visit: Callable[[str, int, int, torch.Tensor], None],
            progress: Callable[[str], None] | None) -> None:
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
    points : N point sources (:class:`~geometry.surfaces.sources.PointSource`) or dicts of tensors.
    k : number of axes (≥ 2; at most the rank of the centred checkpoints, ≤ N − 1).
    center : ``"mean"`` or the index / label of the checkpoint used as centre.
    params : globs selecting the floating-point tensors that span the space (default: all).
    filter_normalize : after the PCA, rescale the axes row by row to the centre's row norms.
    ignore, one_d : the rules of that rescaling, as in
        :func:`~geometry.surfaces.random_planes.filter_normalize`.
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
        raise TrajectoryPCAError(f"{n} checkpoints span at most {n - 1} axes around their centre; "
                                 f"k={k} needs at least {k + 1}")
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
    estimate_memory(shapes, dtypes, n, k, chunk_elements, max_memory,
                    sum(int(getattr(s, "held_bytes", 0)) for s in sources))

    # pass 1: the centre and G = X Xᵀ
    ctr = {nm: torch.empty(shapes[nm], dtype=_storage_dtype(dtypes[nm])) for nm in names}
    gram = torch.zeros(n, n, dtype=torch.float64)

    def centre_of(x: torch.Tensor) -> torch.Tensor:      # float64, recomputed identically in every pass
        return x.mean(0) if center == "mean" else x[int(center)].clone()

    def centre_and_gram(name, lo, hi, x):
        c = centre_of(x)
        _rows(ctr[name])[lo:hi] = c.reshape(hi - lo, -1).to(ctr[name].dtype)
        x -= c
        gram.add_(x @ x.T)

    _stream(names, sources, chunk_elements, centre_and_gram, progress)
    lam, u = torch.linalg.eigh(gram)
    lam, u = lam.flip(0).numpy(), u.flip(1).numpy()
    lam[lam <= n * np.finfo(np.float64).eps * max(lam[0], 0.0)] = 0.0      # numerical zeros (rank < N) are zeros
    idx = np.argmax(np.abs(u), axis=0)                      # sign rule: the largest |u_ij| of each axis > 0
    u = u * np.where(u[idx, np.arange(n)] < 0, -1.0, 1.0)
    total = float(np.clip(lam, 0, None).sum())
    if lam[k - 1] <= 0:
        rank = int((lam > 0).sum())
        raise TrajectoryPCAError(f"the {n} checkpoints span {rank} independent direction(s) around their centre; "
                                 f"k={k} axes need {k}: use fewer axes or checkpoints that differ")
    sigma = np.sqrt(lam[:k])

    # pass 2: the axes e_j = Xᵀ u_j / σ_j
    axes = [{nm: torch.empty(shapes[nm], dtype=_storage_dtype(dtypes[nm])) for nm in names} for _ in range(k)]
    proj = torch.from_numpy((u[:, :k] / sigma).T.copy())     # [k, N]

    def directions(name, lo, hi, x):
        x -= centre_of(x)
        e = proj @ x
        for j in range(k):
            _rows(axes[j][name])[lo:hi] = e[j].reshape(hi - lo, -1).to(axes[j][name].dtype)

    _stream(names, sources, chunk_elements, directions, progress)
    meta = {"filter_normalize": bool(filter_normalize), "params": params, "chunk_elements": int(chunk_elements),
            "sign_rule": "largest |entry| of each eigenvector positive (ties: lowest index)",
            "total_variance": total}
    out = TrajectoryPCA(ctr, axes, labs, u[:, :k] * sigma, sigma, lam[:k] / total, lam, u,
                        "mean" if center == "mean" else labs[int(center)], meta)
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
        e = torch.stack([_rows(d[name])[lo:hi].to(torch.float64).reshape(-1) for d in out.directions])
        dots.add_(x @ e.T)
        gram_e.add_(e @ e.T)

    _stream(names, sources, step, visit, progress)
    dots_np, ge = dots.numpy(), gram_e.numpy()
    dist2 = out.distances ** 2
    out.coords = np.zeros((n, k))
    for a in range(k):
        for b in range(a + 1, k):
            pair = np.array([a, b])
            sub = ge[np.ix_(pair, pair)]
            xy = np.linalg.solve(sub, dots_np[:, pair].T).T           # [N, 2]
            res2 = dist2 - 2 * np.sum(xy * dots_np[:, pair], 1) + np.einsum("ij,jk,ik->i", xy, sub, xy)
            out._fit[(a, b)] = (xy, np.sqrt(np.clip(res2, 0, None)))
            out._fit[(b, a)] = (xy[:, ::-1].copy(), out._fit[(a, b)][1])
    out.coords[:, :2] = out._fit[(0, 1)][0]
    for j in range(2, k):
        out.coords[:, j] = out._fit[(0, j)][0][:, 1]

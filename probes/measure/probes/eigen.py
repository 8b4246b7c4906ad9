"""The ``eigen`` probe: the top-k Hessian eigenvalues on the curvature set.

Plan: ``eigen = { k = 1, method = "lanczos", tol = 1e-3, max_iter = 100 }`` (:class:`EigenProbe`).
One row, spec ``top{k}``: metrics ``lambda_1`` … ``lambda_k``, each with its converged flag (extra:
``residuals``, ``converged``, ``iterations`` = Lanczos steps or power iterations taken, ``method``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from losslens.measure.sharpness import EIGEN_METHODS

from losslens.measure.probes.probe import Probe
from losslens.measure.probes.rows import ProbeRow, hvp_error_flag, metric
from losslens.measure.probes.tasks import curvature_options, make_task
from losslens.measure.probes.validation import PlanError, optional_settings, positive_int


@dataclass(frozen=True)
class EigenProbe:
    """Top-``k`` Hessian eigenvalues (by magnitude, sign kept) by Lanczos (default) or power iteration;
    converged means a true residual ‖Hv − λv‖ ≤ tol·``|λ|``
    (:func:`losslens.geometry.estimators.eigen.top_eigenvalues`)."""

    k: int = 1
    method: str = "lanczos"
    tol: float = 1e-3
    max_iter: int = 100

    def __post_init__(self):
        if self.method not in EIGEN_METHODS:
            raise PlanError(f"eigen method {self.method!r} is unknown; valid: {', '.join(EIGEN_METHODS)}")
        positive_int("eigen.k", self.k)
        positive_int("eigen.max_iter", self.max_iter)
        if not (isinstance(self.tol, (int, float)) and self.tol > 0):
            raise PlanError(f"eigen.tol must be a positive number, got {self.tol!r}")


def tasks(plan) -> list:
    e = plan.eigen
    if e is None:
        return []
    options = {**asdict(e), **curvature_options(plan), "seed": plan.seed}
    return [make_task("eigen", f"top{e.k}", options, curvature=True)]


def run(st, task) -> ProbeRow:
    from losslens.geometry.estimators.eigen import top_eigenvalues
    from losslens.lm.models.zero_embeddings import row_extra as excluded

    o = task.opts
    op = st.hessian()
    res = top_eigenvalues(op, k=o["k"], method=o["method"], tol=o["tol"], max_iter=o["max_iter"], seed=o["seed"])
    return ProbeRow(
        st.label,
        "eigen",
        task.spec,
        metrics=[metric(f"lambda_{i + 1}", v, converged=c) for i, (v, c) in enumerate(zip(res.values, res.converged))],
        extra={
            "residuals": [float(x) for x in res.residuals],
            "converged": [bool(c) for c in res.converged],
            "iterations": int(res.iterations),
            "method": res.method,
            "memory": res.memory,
            **excluded(op),
            **hvp_error_flag(op),
        },
        n_hvp=int(res.num_matvecs),
        seed=o["seed"],
    )


def figure(draw, df, phases, specs) -> dict:
    return {"sharpness": draw.curvature_figure(df, phases)}


PROBE = Probe(
    "eigen",
    "EigenProbe | None",
    None,
    lambda v: optional_settings("eigen", EigenProbe, v),
    tasks,
    run,
    to_dict=lambda s: None if s is None else asdict(s),
    metric="lambda_1",
    aliases={"lambda_max": "lambda_1", "eigen": "lambda_1"},
    figure=figure,
    flags_in_extra=True,
)

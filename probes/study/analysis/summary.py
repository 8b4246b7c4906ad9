"""Summary tables of a sweep: correlations (plain and partial) for several x/y pairs, and the
statistics a report shows (:func:`analyse`).

Checkpoints of one run are a time series: every row gives the pooled r, the within-run r_within
with its 95% interval and p (run-level t over the runs, or an AR(1) effective-n t with one or two
runs, or 'descriptive' where neither holds), n_eff next to n and the inference used
(:mod:`.correlation`, :mod:`.inference`, docs/science.md §6)."""

from __future__ import annotations

import math
from typing import Sequence

from losslens.study.analysis.correlation import correlate, partial_correlation
from losslens.study.analysis.inputs import METHODS, AnalysisError, check_method, check_n_boot
from losslens.study.analysis.phases import detect_phases
from losslens.measure.probes.eigen import PROBE as EIGEN
from losslens.measure.probes.kurtosis import PROBE as KURTOSIS
from losslens.measure.probes.quant import PROBE as QUANT
from losslens.measure.probes.trace import PROBE as TRACE
from losslens.study.analysis.series import checkpoint_runs, series_frame, unconverged

__all__ = ["summary", "analyse", "COLUMNS"]

#: The columns of the correlation summary table, in order.
COLUMNS = [
    "x",
    "y",
    "method",
    "controls",
    "r",
    "r_within",
    "ci_low",
    "ci_high",
    "p",
    "n",
    "n_eff",
    "n_runs",
    "df",
    "inference",
    "n_excluded",
    "n_unconverged",
    "note",
]


def summary(
    df,
    x: str | Sequence[str] | None = None,
    y: str | Sequence[str] | None = None,
    controls: Sequence[str] | str | None = None,
    methods: Sequence[str] = ("pearson", "spearman"),
    n_boot: int = 2000,
    seed: int = 0,
    include_derived: bool = False,
    include_unconverged: bool = False,
    allow_mixed: bool = False,
    n_perm: int = 2000,
):
    """Correlation table: one row per (x, y, method, controls) with the columns ``COLUMNS``:
    r (pooled over runs), r_within (within runs) with its 95% interval [ci_low, ci_high] and
    two-sided p (NaN when 'descriptive'), n, n_eff, runs, df of the t quantile, inference
    ('run-level t', 'effective-n t (AR(1))' or 'descriptive'), n_excluded, n_unconverged and a
    note (what the pooled r means, why a row is descriptive).

    The checkpoints of every run in ``df`` are pooled; each run is one time series (ordered by step).
    Defaults: x = every curvature/weight series present (trace, lambda_max, kurtosis); y = every
    quantizer spec present (its rel_loss_error). With ``controls`` each pair also gets a partial
    correlation row (Pearson/Spearman only). Values whose estimator did not converge are left out
    (counted in ``n_excluded`` and, separately, in ``n_unconverged``) unless ``include_unconverged``.
    Pairs that cannot be computed (too few points, constant series, rows of different settings or
    data without ``allow_mixed``) get a row with NaNs and the reason in ``note``. An unknown method
    or a negative ``n_boot`` raises :class:`AnalysisError`; ``n_boot`` = 0 leaves the intervals out
    (``n_boot``'s other values, ``seed`` and ``n_perm`` no longer change a row: the inference is
    closed-form). Cost per row: O(n) (partial: O(n · k²)).
    """
    import pandas as pd

    methods = [check_method(m) for m in ([methods] if isinstance(methods, str) else methods)]
    if not methods:
        raise AnalysisError(f"no correlation method given; valid: {', '.join(METHODS)}")
    check_n_boot(n_boot, minimum=0)
    xs = (
        _keys(x)
        if x is not None
        else [
            k
            for k, p in ((TRACE.name, TRACE.name), ("lambda_max", EIGEN.name), (KURTOSIS.name, KURTOSIS.name))
            if (df["probe"] == p).any()
        ]
    )
    ys = _keys(y) if y is not None else list(dict.fromkeys(df.loc[df["probe"] == QUANT.name, "spec"]))
    ctrl = _keys(controls) if controls else []
    opts = dict(include_derived=include_derived, include_unconverged=include_unconverged, allow_mixed=allow_mixed)
    stat = dict(n_boot=n_boot, seed=seed, n_perm=n_perm)
    rows = []
    for xk in xs:
        for yk in ys:
            for m in methods:
                variants = [()] + ([tuple(ctrl)] if ctrl and m != "kendall" else [])
                for cv in variants:
                    row = {"x": xk, "y": yk, "method": m, "controls": ",".join(cv)}
                    n_unconv = 0
                    try:
                        frame = series_frame(df, [xk, yk, *cv], **opts)
                        if not include_unconverged:
                            bad = set().union(*(unconverged(df, k, include_derived) for k in (xk, yk, *cv)))
                            n_unconv = len(bad & set(frame.index))
                        runs, order = checkpoint_runs(df, frame.index)
                        frame, runs = frame.iloc[order], runs[order]
                        if cv:
                            c = partial_correlation(
                                frame[xk].to_numpy(float),
                                frame[yk].to_numpy(float),
                                frame[list(cv)],
                                method=m,
                                groups=runs,
                                **stat,
                            )
                        else:
                            c = correlate(
                                frame[xk].to_numpy(float), frame[yk].to_numpy(float), method=m, groups=runs, **stat
                            )
                        row.update(
                            r=c.r,
                            r_within=c.r_within,
                            ci_low=c.ci_low,
                            ci_high=c.ci_high,
                            p=c.p,
                            n=c.n,
                            n_eff=c.n_eff,
                            n_runs=c.n_runs,
                            df=c.df,
                            inference=c.inference,
                            n_excluded=c.n_excluded,
                            n_unconverged=n_unconv,
                            note=c.note,
                        )
                    except AnalysisError as exc:
                        why = (
                            (
                                f" ({n_unconv} value(s) left out because their estimator did not converge; "
                                "include_unconverged=True / --include-unconverged keeps them)"
                            )
                            if n_unconv
                            else ""
                        )
                        row.update(
                            r=math.nan,
                            r_within=math.nan,
                            ci_low=math.nan,
                            ci_high=math.nan,
                            p=math.nan,
                            n=0,
                            n_eff=math.nan,
                            n_runs=0,
                            df=math.nan,
                            inference="",
                            n_excluded=0,
                            n_unconverged=n_unconv,
                            note=f"{exc}{why}",
                        )
                    rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _keys(v) -> list[str]:
    if isinstance(v, str):
        return [v]
    return list(v)


def analyse(df, n_boot: int = 2000, include_unconverged: bool = False, allow_mixed: bool = False):
    """Correlation table and per-run phases of a results table (whatever can be computed): what
    ``losslens report`` shows (options as in :func:`summary`; every run's checkpoints are pooled,
    each run one time series).

    Returns ``(correlations DataFrame | None, {run: Phases} | None, notes)``. What cannot be
    computed for a reason in the data (:class:`AnalysisError`) becomes a note the report shows;
    anything else is a bug and is raised."""
    notes: list[str] = []
    correlations = None
    runs = list(dict.fromkeys(df["run"].fillna("run"))) if "run" in df else ["run"]
    try:
        correlations = summary(df, n_boot=n_boot, include_unconverged=include_unconverged, allow_mixed=allow_mixed)
        if len(runs) > 1:
            notes.append(
                f"correlations pool the checkpoints of {len(runs)} runs (r); r_within, its interval and p are "
                "within runs (runs the independent units, docs/science.md §6)"
            )
    except AnalysisError as exc:
        notes.append(f"correlations not computed: {exc}")
    phases = {}
    qspecs = [s for s in dict.fromkeys(df.loc[df["probe"] == QUANT.name, "spec"]) if isinstance(s, str)]
    for run in runs:
        sub = df[df["run"].fillna("run") == run] if "run" in df else df
        try:
            phases[run if len(runs) > 1 else ""] = detect_phases(sub, gap=qspecs[0] if qspecs else "rtn:4")
        except AnalysisError as exc:
            notes.append(f"phases of {run!r} not computed: {exc}")
    return correlations, (phases or None), notes

"""Statistics along a trajectory (docs/science.md §6): correlations, partial correlations, phases.

    from losslens.study.analysis import summary
    print(summary(df, x="trace", y="rtn:3:row", controls=["lr", "loss"]))

Inputs are per-checkpoint series pulled out of the tidy results DataFrame of
:meth:`losslens.study.sweep.Store.results`. Modules:

- :mod:`.series`      -- :func:`series` / :func:`series_frame`: one per-checkpoint series by a short key;
- :mod:`.correlation` -- :func:`correlate` (Pearson, Spearman, Kendall) and :func:`partial_correlation`:
  r pooled over runs and r_within with a 95% interval and p that treat runs as the independent units;
- :mod:`.inference`   -- that inference (run-level t, AR(1) effective-n t, 'descriptive'), vectorised;
- :mod:`.dependence`  -- runs, autocorrelations and Bartlett's nonparametric n_eff;
- :mod:`.phases`      -- :func:`convergence_onset`, :func:`divergence_onset`, :func:`detect_phases`
  (seed 004's phases);
- :mod:`.summary`     -- :func:`summary` (a table of correlations for several x/y pairs) and
  :func:`analyse` (what ``losslens report`` shows);
- :mod:`.explain_shares` -- :func:`factor_table`, :func:`decompose_change`, :func:`science_check`: why ΔQ
  changes (shares of ‖δ‖², tr H/n, κ and the remainder, from the ``explain`` probe);
- :mod:`.inputs`      -- :class:`AnalysisError` and the input checks.

Missing values: a pair with a NaN on either side (or in a covariate) is excluded from every
statistic and counted in ``n_excluded``; values are never imputed or averaged in. Values whose
estimator did not converge are excluded the same way (and counted in ``n_unconverged``) unless
``include_unconverged=True``; rows of different settings or data are never pooled unless
``allow_mixed=True`` (see :mod:`.series`).
"""

from losslens.study.analysis.correlation import Correlation, correlate, partial_correlation
from losslens.study.analysis.explain_shares import decompose_change, factor_table, format_check, science_check
from losslens.study.analysis.inputs import METHODS, AnalysisError
from losslens.study.analysis.phases import Onset, Phases, convergence_onset, detect_phases, divergence_onset
from losslens.study.analysis.series import series, series_frame, unconverged
from losslens.study.analysis.summary import analyse, summary

__all__ = [
    "Correlation",
    "Onset",
    "Phases",
    "AnalysisError",
    "correlate",
    "partial_correlation",
    "convergence_onset",
    "divergence_onset",
    "detect_phases",
    "series",
    "series_frame",
    "unconverged",
    "summary",
    "analyse",
    "METHODS",
    "factor_table",
    "decompose_change",
    "science_check",
    "format_check",
]

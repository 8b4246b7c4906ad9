"""Why quantization error changes along a trajectory: the ``explain`` probe's factors, analysed.

An ``explain`` row (:mod:`losslens.measure.explain`) measures, on the curvature set,
ΔL = gᵀδ + ½δᵀHδ + remainder and ½δᵀHδ = ½ · ‖δ‖² · (tr H/n) · κ. With r = ΔL / (½δᵀHδ) (the
non-quadratic factor: 1 + (gᵀδ + remainder)/(½δᵀHδ)) and ΔQ = ΔL / L,

    log ΔQ = log ‖δ‖² + log(tr H/n) + log κ + log r − log L − log 2,

so the change of log ΔQ between two checkpoints is *exactly* the sum of five shares:
``norm2``, ``trace_per_param``, ``kappa``, ``non_quadratic`` and ``fp_loss`` (the last absent for
``target="abs"``, i.e. ΔL). The trace is an estimate: its delta-method error moves between the
trace and κ shares (their sum, the change of the Rayleigh quotient δᵀHδ/‖δ‖², is exact); the
intervals are ``± q · sqrt(se₁² + se₂²)`` of log tr H with q the larger Student-t quantile of the two
estimates. They cover the estimator's noise only, not the choice of data batches.

* :func:`factor_table` — one row per checkpoint of one spec: every factor with its interval;
* :func:`decompose_change` — the five shares between two checkpoints;
* :func:`science_check` — the three questions of issue 15 (what drives ΔQ up in the LR decay;
  GPTQ/AWQ vs RTN at equal bits: ‖δ‖ or κ; LAWA vs the final checkpoint), and
  :func:`format_check` — the same as markdown.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from losslens.measure.explain.explanation import FACTOR_METRICS
from losslens.measure.probes.explain import PROBE as EXPLAIN
from losslens.study.analysis.inputs import AnalysisError

__all__ = [
    "factor_table",
    "decompose_change",
    "decay_window",
    "science_check",
    "format_check",
    "explain_specs",
    "TERMS",
]

TERMS = ("norm2", "trace_per_param", "kappa", "non_quadratic", "fp_loss")
"""The shares of :func:`decompose_change`, in order."""
_FACTORS = FACTOR_METRICS
_CKPT = ["run", "checkpoint", "step", "lr", "derived"]


def explain_specs(df) -> list[str]:
    """Quantizer specs of the ``explain`` rows (ok), in table order."""
    sel = df[(df["probe"] == EXPLAIN.name) & (df["status"] == "ok")]
    return [s for s in dict.fromkeys(sel["spec"]) if isinstance(s, str)]


def factor_table(df, spec: str | None = None):
    """One row per (run, checkpoint) of the ``explain`` rows of ``spec`` (default: the first):
    checkpoint columns, every factor, and ``trace_stderr``, ``trace_ci_low/high``,
    ``kappa_stderr``, ``kappa_ci_low/high``. Derived (LAWA) checkpoints included, flagged."""
    import pandas as pd

    specs = explain_specs(df)
    if not specs:
        raise AnalysisError("the results hold no ok 'explain' rows; run a sweep with an explain probe")
    spec = spec if spec is not None else specs[0]
    if spec not in specs:
        canon = _canonical(spec)
        if canon not in specs:
            raise AnalysisError(f"no explain rows for spec {spec!r}; available: {specs}")
        spec = canon
    sel = df[
        (df["probe"] == EXPLAIN.name) & (df["status"] == "ok") & (df["spec"] == spec) & df["metric"].isin(_FACTORS)
    ]
    sel = sel.assign(run=sel["run"].fillna("run") if "run" in sel else "run")
    key = ["run", "checkpoint"]
    wide = sel.pivot_table(index=key, columns="metric", values="value", aggfunc="last")
    for m, col in (("trace", "trace"), ("kappa", "kappa")):
        part = sel[sel["metric"] == m].drop_duplicates(key, keep="last").set_index(key)
        for c in ("stderr", "ci_low", "ci_high"):
            wide[f"{col}_{c}"] = part[c].reindex(wide.index)
    ck = sel[_CKPT].drop_duplicates(key, keep="last").set_index(key)
    out = ck.join(wide, how="inner").reset_index()
    order = {k: i for i, k in enumerate(dict.fromkeys(zip(sel["run"], sel["checkpoint"])))}
    out["_o"] = [order[(r, c)] for r, c in zip(out["run"], out["checkpoint"])]
    out = out.sort_values("_o").drop(columns="_o").reset_index(drop=True)
    out.insert(2, "spec", spec)
    return pd.DataFrame(out)


def _canonical(spec: str) -> str | None:
    try:
        from losslens.lm.quant import QuantSpec

        return str(QuantSpec.parse(spec))
    except Exception:
        return None


def _row(table, label: str, run: str | None):
    sub = table if run is None else table[table["run"] == run]
    hit = sub[sub["checkpoint"] == label]
    if hit.empty:
        raise AnalysisError(
            f"checkpoint {label!r}{f' of run {run!r}' if run else ''} has no explain row; "
            f"available: {list(sub['checkpoint'])}"
        )
    if len(hit) > 1:
        raise AnalysisError(f"checkpoint {label!r} is in several runs {sorted(set(hit['run']))}; pass run=")
    return hit.iloc[0]


def _logs(r, target: str) -> dict[str, float]:
    q, dl, loss = float(r["quadratic"]), float(r["actual_delta"]), float(r["loss"])
    if not (q > 0 and dl > 0):
        raise AnalysisError(
            f"{r['checkpoint']}: ΔL = {dl:.2g}, ½δᵀHδ = {q:.2g}; log-scale shares need both > 0 "
            "(a quantizer this mild is within noise; use a harsher spec)"
        )
    if not (float(r["trace_per_param"]) > 0 and float(r["kappa"]) > 0):
        raise AnalysisError(f"{r['checkpoint']}: tr H estimate ≤ 0; spend more trace HVPs")
    out = {
        "norm2": math.log(r["norm2"]),
        "trace_per_param": math.log(r["trace_per_param"]),
        "kappa": math.log(r["kappa"]),
        "non_quadratic": math.log(dl / q),
        "fp_loss": -math.log(loss) if target == "rel" else 0.0,
    }
    return out


def _trace_noise(r) -> tuple[float, float]:
    """(stderr of log tr H, its interval's quantile)."""
    t, se, hi = float(r["trace"]), float(r.get("trace_stderr", math.nan)), float(r.get("trace_ci_high", math.nan))
    if not math.isfinite(se) or se == 0:
        return (0.0 if se == 0 else math.inf), 0.0
    return se / abs(t), (hi - t) / se if math.isfinite(hi) else math.inf


def decompose_change(table, start: str, end: str, run: str | None = None, target: str = "rel"):
    """The change of log ΔQ (``target="rel"``) or log ΔL (``"abs"``) from checkpoint ``start`` to
    ``end`` (labels in a :func:`factor_table`) as shares that sum to it exactly.

    Returns a DataFrame with one row per term of :data:`TERMS` (``fp_loss`` only for ``"rel"``) and
    a ``total`` row: ``log_change`` (natural log of end/start), ``fraction`` (of the total),
    ``stderr``, ``ci_low``, ``ci_high`` (trace noise, on the trace and κ terms only), plus the
    ``start`` and ``end`` values of each factor. Raises :class:`AnalysisError` when ΔL or ½δᵀHδ is
    not positive at either end (no log scale).
    """
    import pandas as pd

    if target not in ("rel", "abs"):
        raise AnalysisError(f"target must be 'rel' (ΔQ = ΔL/L) or 'abs' (ΔL), got {target!r}")
    a, b = _row(table, start, run), _row(table, end, run)
    la, lb = _logs(a, target), _logs(b, target)
    (sa, qa), (sb, qb) = _trace_noise(a), _trace_noise(b)
    se, q = math.hypot(sa, sb), max(qa, qb)
    values = {
        "norm2": ("norm2",),
        "trace_per_param": ("trace_per_param",),
        "kappa": ("kappa",),
        "non_quadratic": ("actual_delta", "quadratic"),
        "fp_loss": ("loss",),
    }
    terms = [t for t in TERMS if target == "rel" or t != "fp_loss"]
    total = math.fsum(lb[t] - la[t] for t in terms)
    rows = []
    for t in terms:
        d = lb[t] - la[t]
        noisy = t in ("trace_per_param", "kappa")
        v0 = _value(a, values[t]) if t != "fp_loss" else float(a["loss"])
        v1 = _value(b, values[t]) if t != "fp_loss" else float(b["loss"])
        rows.append(
            {
                "term": t,
                "log_change": d,
                "fraction": d / total if total else math.nan,
                "stderr": se if noisy else 0.0,
                "ci_low": d - q * se if noisy else d,
                "ci_high": d + q * se if noisy else d,
                "start": v0,
                "end": v1,
            }
        )
    key = "rel_delta" if target == "rel" else "actual_delta"
    rows.append(
        {
            "term": "total",
            "log_change": total,
            "fraction": 1.0,
            "stderr": 0.0,
            "ci_low": total,
            "ci_high": total,
            "start": float(a[key]),
            "end": float(b[key]),
        }
    )
    out = pd.DataFrame(rows)
    out.attrs.update(start=start, end=end, run=run, target=target)
    return out


def _value(r, cols: Sequence[str]) -> float:
    return float(r[cols[0]]) if len(cols) == 1 else float(r[cols[0]]) / float(r[cols[1]])


def decay_window(table, run: str) -> tuple[str, str]:
    """(start, end) labels of the LR decay of ``run``: the last real checkpoint still at the peak
    LR, and the last real checkpoint. Raises when the LR is unknown or never decays."""
    sub = table[(table["run"] == run) & ~table["derived"].astype(bool)]
    sub = sub.sort_values("step", kind="stable")
    lr = sub["lr"].astype(float).to_numpy()
    if len(sub) < 2 or not np.isfinite(lr).all():
        raise AnalysisError(f"run {run!r}: the decay window needs ≥ 2 real checkpoints with a known LR")
    peak = int(np.flatnonzero(lr >= lr.max() * (1 - 1e-9))[-1])
    if peak == len(sub) - 1:
        raise AnalysisError(f"run {run!r}: the LR does not decay after its peak at the last checkpoint")
    return str(sub["checkpoint"].iloc[peak]), str(sub["checkpoint"].iloc[-1])


def _flat(dec, **head) -> dict:
    row = dict(head)
    for _, r in dec.iterrows():
        row[r["term"]] = r["log_change"]
        if r["term"] in ("trace_per_param", "kappa"):
            row[f"{r['term']}_ci"] = (r["ci_low"], r["ci_high"])
    drivers = dec[dec["term"].isin(("norm2", "trace_per_param", "kappa", "non_quadratic"))]
    row["driver"] = drivers.loc[drivers["log_change"].abs().idxmax(), "term"]
    row["total"] = float(dec.loc[dec["term"] == "total", "log_change"].iloc[0])
    return row


def _pairs(specs: Sequence[str]) -> list[tuple[str, str]]:
    """(calibrated, rtn) pairs with equal bits and group size among ``specs``."""
    from losslens.lm.quant import QuantSpec

    parsed = {s: QuantSpec.parse(s) for s in specs}
    rtn = {(p.bits, p.group_size): s for s, p in parsed.items() if p.method == "rtn"}
    return [
        (s, rtn[(p.bits, p.group_size)])
        for s, p in parsed.items()
        if p.method in ("gptq", "awq", "gptqmodel") and (p.bits, p.group_size) in rtn
    ]


def _mean_ci(x: np.ndarray, runs: np.ndarray) -> tuple[float, float, float, str]:
    """Mean of x over checkpoints and its 95% interval with runs as the independent units
    (:func:`.inference.mean_interval`: run-level t with ≥ 3 runs, AR(1) effective n with fewer,
    NaN where neither holds): a run's checkpoints are autocorrelated, never independent draws."""
    from losslens.study.analysis.inference import mean_interval

    return mean_interval([x[runs == r] for r in dict.fromkeys(runs)])


def science_check(df, specs: Sequence[str] | None = None, target: str = "rel") -> dict:
    """Issue 15's three questions, from the ``explain`` rows of a sweep store's tidy table.

    Returns ``{"decay": DataFrame, "quantizers": DataFrame, "lawa": DataFrame, "notes": [str]}``:

    * ``decay`` — per run and spec, the shares of the change of log ΔQ over the LR decay
      (:func:`decay_window`) and the ``driver`` (the largest of ‖δ‖², tr H/n, κ, non-quadratic);
    * ``quantizers`` — per (calibrated, RTN) pair at equal bits and groups, over every real
      checkpoint: mean log ratios of ‖δ‖², κ, ½δᵀHδ (= the first two: tr H is shared, so the κ
      ratio carries no trace noise) and ΔL (over the ``n_delta`` checkpoints where both ΔL share a
      sign), with 95% intervals that treat runs as the independent units (``{name}_inference``:
      run-level t, effective-n t or descriptive; ``_mean_ci``), and the median κ of each;
    * ``lawa`` — per run and spec, the shares from the final real checkpoint to the LAWA one.

    What cannot be computed (ΔL ≤ 0, no decay, no LAWA row) is skipped with a line in ``notes``.
    """
    import pandas as pd

    specs = list(specs) if specs is not None else explain_specs(df)
    if not specs:
        raise AnalysisError("the results hold no ok 'explain' rows; run a sweep with an explain probe")
    tables = {s: factor_table(df, s) for s in specs}
    notes: list[str] = []
    decay, lawa = [], []
    for s, tab in tables.items():
        for run in dict.fromkeys(tab["run"]):
            try:
                a, b = decay_window(tab, run)
                decay.append(_flat(decompose_change(tab, a, b, run, target), run=run, spec=s, start=a, end=b))
            except AnalysisError as exc:
                notes.append(f"decay {run} {s}: {exc}")
            sub = tab[tab["run"] == run]
            real, derived = sub[~sub["derived"].astype(bool)], sub[sub["derived"].astype(bool)]
            if real.empty or derived.empty:
                continue
            final = str(real.sort_values("step")["checkpoint"].iloc[-1])
            for lab in derived["checkpoint"]:
                try:
                    lawa.append(
                        _flat(
                            decompose_change(tab, final, str(lab), run, target), run=run, spec=s, start=final, end=lab
                        )
                    )
                except AnalysisError as exc:
                    notes.append(f"lawa {run} {s}: {exc}")
    quant = []
    for cal, rtn in _pairs(specs):
        a, b = tables[cal], tables[rtn]
        m = a.merge(b, on=["run", "checkpoint"], suffixes=("_c", "_r"))
        m = m[~m["derived_c"].astype(bool)]
        if m.empty:
            notes.append(f"{cal} vs {rtn}: no common real checkpoint")
            continue
        row = {
            "calibrated": cal,
            "rtn": rtn,
            "n": int(len(m)),
            "kappa_calibrated": float(m["kappa_c"].median()),
            "kappa_rtn": float(m["kappa_r"].median()),
        }
        with np.errstate(divide="ignore", invalid="ignore"):
            for name, col in (
                ("log_norm2_ratio", "norm2"),
                ("log_kappa_ratio", "kappa"),
                ("log_quadratic_ratio", "quadratic"),
                ("log_delta_ratio", "actual_delta"),
            ):
                ratio = (m[f"{col}_c"] / m[f"{col}_r"]).to_numpy(float)
                logs = np.where(ratio > 0, np.log(np.where(ratio > 0, ratio, 1.0)), np.nan)
                mean, lo, hi, how = _mean_ci(logs, m["run"].to_numpy())
                row[name], row[f"{name}_ci"], row[f"{name}_inference"] = mean, (lo, hi), how
        row["n_delta"] = int(np.isfinite(logs).sum())  # checkpoints where both ΔL have one sign (a log ratio exists)
        quant.append(row)
    return {"decay": pd.DataFrame(decay), "quantizers": pd.DataFrame(quant), "lawa": pd.DataFrame(lawa), "notes": notes}


def _ci(v, ci) -> str:
    if not isinstance(ci, tuple) or not all(math.isfinite(x) for x in ci):
        return f"{v:+.2f}"
    return f"{v:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def format_check(check: dict) -> str:
    """:func:`science_check` as markdown (log-ratios, natural log; intervals in brackets)."""
    lines = []
    for key, title in (("decay", "Change of log ΔQ over the LR decay"), ("lawa", "Final checkpoint → LAWA")):
        t = check[key]
        lines += [
            f"**{title}** (shares of the change of log ΔQ; they sum to the total)",
            "",
            "| run | spec | from → to | total | ‖δ‖² | tr H/n | κ | non-quadratic | 1/L | driver |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for _, r in t.iterrows():
            lines.append(
                f"| {r['run']} | {r['spec']} | {r['start']} → {r['end']} | {r['total']:+.2f} | {r['norm2']:+.2f} | "
                f"{_ci(r['trace_per_param'], r['trace_per_param_ci'])} | {_ci(r['kappa'], r['kappa_ci'])} | "
                f"{r['non_quadratic']:+.2f} | {r.get('fp_loss', 0.0):+.2f} | {r['driver']} |"
            )
        lines.append("")
    q = check["quantizers"]
    lines += [
        "**Calibrated quantizer vs RTN at equal bits** (mean log ratio calibrated/RTN over checkpoints; 95% CI with "
        "runs as the independent units — run-level t with ≥ 3 runs, AR(1) effective n with fewer; no bracket: "
        "descriptive, the data do not support an interval)",
        "",
        "| pair | n | κ (median) | log ‖δ‖² ratio | log κ ratio | log ½δᵀHδ ratio | log ΔL ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in q.iterrows():
        lines.append(
            f"| {r['calibrated']} vs {r['rtn']} | {r['n']} | {r['kappa_calibrated']:.3f} vs {r['kappa_rtn']:.3f} | "
            + " | ".join(_ci(r[k], r[f"{k}_ci"]) for k in ("log_norm2_ratio", "log_kappa_ratio", "log_quadratic_ratio"))
            + f" | {_ci(r['log_delta_ratio'], r['log_delta_ratio_ci'])} (n = {r['n_delta']}) |"
        )
    if check.get("notes"):
        lines += ["", "Not computed: " + "; ".join(check["notes"])]
    return "\n".join(lines)

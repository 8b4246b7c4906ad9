"""Does task accuracy fall where the quantization loss error rises? (the accuracy probe's summary)

:func:`accuracy_verdict` correlates, across checkpoints (every run pooled, derived checkpoints
left out), ΔQ L of a quantizer (``quant`` rows) with its Δacc (``accuracy`` rows: mean over tasks),
Spearman within runs with its 95% interval (:func:`losslens.study.analysis.summary`: runs are the
independent units), and says in one sentence whether accuracy falls where ΔQ rises: "yes" when the
within-run r < 0 and the interval excludes 0, "no" when r > 0 and it excludes 0, otherwise "not
resolved" (also when the row is descriptive: too few runs for an honest interval; docs/science.md §6).
"""

from __future__ import annotations

import math

from losslens.study.analysis.inputs import AnalysisError
from losslens.measure.probes.accuracy import PROBE as ACCURACY

__all__ = ["accuracy_verdict"]


def accuracy_verdict(df, spec: str | None = None, n_boot: int = 2000, seed: int = 0) -> dict:
    """``{"spec", "r", "ci_low", "ci_high", "p", "n", "answer", "text"}`` for quantizer ``spec``
    (default: the first spec with accuracy rows). Raises :class:`AnalysisError` when the results
    hold no accuracy row of a quantizer."""
    from losslens.study.analysis.summary import summary

    acc = df[(df["probe"] == ACCURACY.name) & (df["metric"] == "delta_acc") & (df["status"] == "ok")]
    specs = [s for s in dict.fromkeys(acc["spec"]) if isinstance(s, str) and "@" not in s]
    if not specs:
        raise AnalysisError(
            "the results hold no accuracy row of a quantizer (delta_acc); add the accuracy probe with specs"
        )
    spec = spec if spec is not None else specs[0]
    tab = summary(df, x=[spec], y=[f"delta_acc:{spec}"], methods=("spearman",), n_boot=n_boot, seed=seed)
    r = tab.iloc[0]
    # the interval is about the within-run correlation (docs/science.md §6); the answer follows it
    rv, lo, hi = float(r["r_within"]), float(r["ci_low"]), float(r["ci_high"])
    if not math.isfinite(rv):
        answer = "not resolved"
    elif rv < 0 and hi < 0:
        answer = "yes"
    elif rv > 0 and lo > 0:
        answer = "no"
    else:
        answer = "not resolved"
    ci = f"[{lo:+.2f}, {hi:+.2f}] ({r['inference']})" if math.isfinite(lo) else f"({r['inference'] or 'no interval'})"
    text = (
        f"Does task accuracy fall where ΔQ rises ({spec})? {answer}: "
        f"Spearman r(ΔQ L, Δacc) within runs = {rv:+.2f} "
        f"{ci}, pooled {float(r['r']):+.2f}, n = {int(r['n'])} checkpoints"
        + (f" ({r['note']})" if r.get("note") else "")
        + "."
    )
    return {
        "spec": spec,
        "r": rv,
        "ci_low": lo,
        "ci_high": hi,
        "p": float(r["p"]),
        "n": int(r["n"]),
        "answer": answer,
        "text": text,
    }

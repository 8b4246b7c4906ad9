"""Per-checkpoint series out of the tidy results table of :meth:`probes.sweep.Store.results`.

:func:`series` pulls one series by a short key (index: checkpoint label, in trajectory order;
derived LAWA checkpoints are left out by default because they are not points *along* the
trajectory); :func:`series_frame` puts several side by side.
"""
from __future__ import annotations

from typing import Sequence

from .inputs import AnalysisError

__all__ = ["series", "series_frame", "CHECKPOINT_COLUMNS"]

CHECKPOINT_COLUMNS = ("step", "tokens", "lr")
_DEFAULT_METRIC = {"loss": "loss", "quant": "rel_loss_error", "trace": "trace", "eigen": "lambda_1",
                   "block_trace": "trace", "directional": "dHd", "kurtosis": "pooled", "explain": "kappa"}
_ALIASES = {"lambda_max": ("eigen", None, "lambda_1"), "ppl": ("loss", None, "ppl"), "fp_loss": ("loss", None, "loss"),
            "kurtosis": ("kurtosis", None, "pooled"), "loss": ("loss", None, "loss"), "trace": ("trace", None, "trace"),
            "eigen": ("eigen", None, "lambda_1")}


def _canonical_quant(key: str) -> str | None:
    try:
        from probes.quant import QuantSpec  # type: ignore

        return str(QuantSpec.parse(key))
    except Exception:
        return None


def _resolve(df, key: str) -> tuple[str | None, str | None, str]:
    """(probe, spec, metric) for a series key; probe None means a checkpoint column."""
    if key in CHECKPOINT_COLUMNS:
        return None, None, key
    if "/" in key:
        parts = key.split("/")
        if len(parts) == 3:
            return parts[0], parts[1] or None, parts[2]
        if len(parts) == 2:
            return parts[0], parts[1] or None, _DEFAULT_METRIC.get(parts[0], "")
        raise AnalysisError(f"series key {key!r}: use 'probe/spec/metric', e.g. 'quant/gptq:3:g128/ppl_gap'")
    if key in _ALIASES:
        return _ALIASES[key]
    probes = set(df["probe"].dropna().unique())
    metrics = df.loc[df["metric"].notna(), ["probe", "metric"]].drop_duplicates()
    hit = metrics[metrics["metric"] == key]
    if len(hit) == 1:
        return hit["probe"].iloc[0], None, key
    if len(hit) > 1:
        raise AnalysisError(f"metric {key!r} is measured by several probes ({sorted(hit['probe'])}); use 'probe/spec/metric'")
    if key in probes:
        return key, None, _DEFAULT_METRIC.get(key, "")
    qspecs = set(df.loc[df["probe"] == "quant", "spec"].unique())
    canon = _canonical_quant(key)
    for cand in (key, canon):
        if cand is not None and cand in qspecs:
            return "quant", cand, "rel_loss_error"
    valid = sorted(CHECKPOINT_COLUMNS) + sorted(set(_ALIASES) | probes | set(metrics["metric"])) + sorted(qspecs)
    raise AnalysisError(f"unknown series {key!r}; valid keys include: {', '.join(valid)} (or 'probe/spec/metric')")


def _run_qualified(df):
    """``df`` with checkpoint labels made unique across runs (``run/label``) when it holds several
    runs (a store of several trajectories shares labels such as ``step-000100``); unchanged otherwise."""
    if "run" not in df.columns or df["run"].nunique(dropna=False) <= 1:
        return df
    out = df.copy()
    out["checkpoint"] = out["run"].astype(str) + "/" + out["checkpoint"].astype(str)
    return out


def series(df, key: str, include_derived: bool = False):
    """One per-checkpoint series (pandas Series indexed by checkpoint label, trajectory order;
    ``run/label`` when the table holds several runs, which are then pooled).

    ``key``: a checkpoint column ('step', 'tokens', 'lr'); a probe ('loss', 'trace', 'eigen',
    'kurtosis' → its main metric; 'lambda_max' = lambda_1); a metric name measured by one probe
    ('ppl', 'lambda_2', 'q_loss' is ambiguous once several specs exist); a quantizer spec
    ('gptq:3:g128' → its rel_loss_error); or explicit 'probe/spec/metric'
    ('quant/rtn:4/ppl_gap', 'directional/rtn:4/dHd', 'block_trace/layer0/trace').
    Failed probes give NaN. Raises :class:`AnalysisError` for an unknown or ambiguous key.
    """
    import pandas as pd

    if df is None or len(df) == 0:
        raise AnalysisError("the results table is empty")
    df = _run_qualified(df)
    base = df if include_derived else df[~df["derived"].astype(bool)]
    order = list(dict.fromkeys(base["checkpoint"]))
    probe, spec, metric = _resolve(df, key)
    if probe is None:
        s = base.drop_duplicates("checkpoint").set_index("checkpoint")[metric].astype(float)
        return s.reindex(order).rename(key)
    sel = base[(base["probe"] == probe) & (base["metric"] == metric) & (base["status"] == "ok")]
    specs = list(dict.fromkeys(base.loc[base["probe"] == probe, "spec"]))
    if spec is not None:
        if spec not in specs:
            canon = _canonical_quant(spec)
            if canon in specs:
                spec = canon
            else:
                raise AnalysisError(f"probe {probe!r} has no spec {spec!r}; available: {specs}")
        sel = sel[sel["spec"] == spec]
    else:
        used = list(dict.fromkeys(sel["spec"]))
        if len(used) > 1:
            raise AnalysisError(f"{key!r} is ambiguous: probe {probe!r} has specs {used}; use '{probe}/<spec>/{metric}'")
    if sel.empty and not (base["probe"] == probe).any():
        raise AnalysisError(f"the results hold no {probe!r} probe")
    s = sel.drop_duplicates("checkpoint", keep="last").set_index("checkpoint")["value"].astype(float)
    return pd.Series(s.reindex(order).to_numpy(float), index=pd.Index(order, name="checkpoint"), name=key)


def series_frame(df, keys: Sequence[str], include_derived: bool = False):
    """Several :func:`series` side by side as a DataFrame (index: checkpoint)."""
    import pandas as pd

    return pd.concat([series(df, k, include_derived=include_derived) for k in dict.fromkeys(keys)], axis=1)

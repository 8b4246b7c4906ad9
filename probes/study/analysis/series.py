"""Per-checkpoint series out of the tidy results table of :meth:`losslens.study.sweep.Store.results`.

:func:`series` pulls one series by a short key (index: checkpoint label, in trajectory order;
derived LAWA checkpoints are left out by default because they are not points *along* the
trajectory); :func:`series_frame` puts several side by side.

Honesty rules (each can be lifted by an argument, never silently): values whose estimator did not
converge (``converged`` False, e.g. power iteration stopped at ``max_iter``) are NaN unless
``include_unconverged``; :func:`unconverged` names them. A series whose rows were computed with
different settings (two plans in one store, or estimators whose memory budgets chose different
sketch sizes, bases or blocks: the ``chosen`` column) or series measured on different data raise
:class:`AnalysisError` unless ``allow_mixed``.
"""

from __future__ import annotations

from typing import Sequence

from losslens.measure.probes.registry import REGISTRY

from losslens.study.analysis.inputs import AnalysisError

__all__ = ["series", "series_frame", "unconverged", "checkpoint_runs", "CHECKPOINT_COLUMNS"]

CHECKPOINT_COLUMNS = ("step", "tokens", "lr")
# The series keys each probe declares (losslens.measure.probes.probe.Probe): its default metric, aliases,
# metric names that take a spec ("delta_acc:rtn:4" = accuracy/rtn:4/delta_acc) and bare-spec keys.
_DEFAULT_METRIC = {p.name: p.metric for p in REGISTRY}
_ALIASES = {key: (p.name, None, m) for p in REGISTRY for key, m in p.aliases.items()}
_SPEC_KEYS = {head: p.name for p in REGISTRY for head in p.spec_keys}
_BARE_SPEC = tuple(p.name for p in REGISTRY if p.bare_spec)


def _canonical_quant(key: str) -> str | None:
    try:
        from losslens.lm.quant import QuantSpec  # type: ignore

        return str(QuantSpec.parse(key))
    except Exception:
        return None


def _resolve(df, key: str) -> tuple[str | None, str | None, str]:
    """(probe, spec, metric) for a series key; probe None means a checkpoint column."""
    if key in CHECKPOINT_COLUMNS:
        return None, None, key
    head, sep, rest = key.partition(":")
    if sep and head in _SPEC_KEYS and "/" not in key:
        return _SPEC_KEYS[head], rest, head
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
        raise AnalysisError(
            f"metric {key!r} is measured by several probes ({sorted(hit['probe'])}); use 'probe/spec/metric'"
        )
    if key in probes:
        return key, None, _DEFAULT_METRIC.get(key, "")
    qspecs: set = set()
    canon = _canonical_quant(key)
    for name in _BARE_SPEC:
        specs = set(df.loc[df["probe"] == name, "spec"].unique())
        for cand in (key, canon):
            if cand is not None and cand in specs:
                return name, cand, _DEFAULT_METRIC[name]
        qspecs |= specs
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


def _rows(df, key: str, include_derived: bool):
    """(probe, metric, checkpoint order, base table, the ok rows of the series or None for a
    checkpoint column) of one series key."""
    if df is None or len(df) == 0:
        raise AnalysisError("the results table is empty")
    df = _run_qualified(df)
    base = df if include_derived else df[~df["derived"].astype(bool)]
    order = list(dict.fromkeys(base["checkpoint"]))
    probe, spec, metric = _resolve(df, key)
    if probe is None:
        return probe, metric, order, base, None
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
            raise AnalysisError(
                f"{key!r} is ambiguous: probe {probe!r} has specs {used}; use '{probe}/<spec>/{metric}'"
            )
    if sel.empty and not (base["probe"] == probe).any():
        raise AnalysisError(f"the results hold no {probe!r} probe")
    return probe, metric, order, base, sel.drop_duplicates("checkpoint", keep="last")


def _unconverged(sel):
    """Boolean mask of the rows whose estimator did not converge (missing flag = no criterion)."""
    if sel is None or "converged" not in sel.columns:
        return None
    return sel["converged"].astype("boolean").eq(False).fillna(False).to_numpy(bool)


def _distinct(sel, column: str) -> list[str]:
    if sel is None or column not in sel.columns:
        return []
    return sorted({str(v) for v in sel[column].dropna() if str(v)})


def _check_one_setting(key: str, sel) -> None:
    cfg = _distinct(sel, "config_hash")
    chosen = _distinct(sel, "chosen")
    if len(chosen) > 1:
        counts = sel["chosen"].fillna("").astype(str).value_counts()
        raise AnalysisError(
            f"series {key!r} pools rows whose estimators chose {len(counts)} different settings within their memory "
            "budgets or recorded different quantizer variants ("
            + "; ".join(f"{c or 'none recorded'}: {n} checkpoints" for c, n in counts.items())
            + "), e.g. a smaller Hutch++ sketch or Lanczos basis where less memory was allowed; numbers computed "
            "differently are not comparable. Pass allow_mixed=True (CLI: --allow-mixed) to pool them anyway, or "
            "rerun with one --max-memory so every checkpoint gets the same settings."
        )
    if len(cfg) > 1:
        counts = sel["config_hash"].astype(str).value_counts()
        raise AnalysisError(
            f"series {key!r} pools rows computed with {len(cfg)} different settings (config hashes "
            + ", ".join(f"{h[:12]}: {n} checkpoints" for h, n in counts.items() if h)
            + "), e.g. from two plans in one store; numbers computed differently are not comparable. Pass "
            "allow_mixed=True (CLI: --allow-mixed) to pool them anyway, or rerun the sweep so every checkpoint "
            "has the same settings."
        )


def series(df, key: str, include_derived: bool = False, include_unconverged: bool = False, allow_mixed: bool = False):
    """One per-checkpoint series (pandas Series indexed by checkpoint label, trajectory order;
    ``run/label`` when the table holds several runs, which are then pooled).

    ``key``: a checkpoint column ('step', 'tokens', 'lr'); a probe ('loss', 'trace', 'eigen',
    'kurtosis' → its main metric; 'lambda_max' = lambda_1); a metric name measured by one probe
    ('ppl', 'lambda_2', 'q_loss' is ambiguous once several specs exist); a quantizer spec
    ('gptq:3:g128' → its rel_loss_error); task accuracy ('delta_acc:rtn:4' = Δacc of the mean over
    tasks, 'rel_drop:rtn:4', 'acc:fp', 'delta_acc:rtn:4@arc_easy'); or explicit 'probe/spec/metric'
    ('quant/rtn:4/ppl_gap', 'directional/rtn:4/dHd', 'block_trace/layer0/trace').
    Failed probes give NaN; so do values whose estimator did not converge (the ``converged``
    column is False) unless ``include_unconverged``. Rows of one series computed with different
    settings (``config_hash``, or the settings a memory plan chose: ``chosen``) raise
    :class:`AnalysisError` unless ``allow_mixed``. Raises
    :class:`AnalysisError` for an unknown or ambiguous key.
    """
    import pandas as pd

    probe, metric, order, base, sel = _rows(df, key, include_derived)
    if sel is None:
        s = base.drop_duplicates("checkpoint").set_index("checkpoint")[metric].astype(float)
        return s.reindex(order).rename(key)
    if not allow_mixed:
        _check_one_setting(key, sel)
    values = sel["value"].astype(float).to_numpy(copy=True)
    bad = _unconverged(sel)
    if bad is not None and not include_unconverged:
        values[bad] = float("nan")
    s = pd.Series(values, index=pd.Index(sel["checkpoint"]))
    return pd.Series(s.reindex(order).to_numpy(float), index=pd.Index(order, name="checkpoint"), name=key)


def unconverged(df, key: str, include_derived: bool = False) -> list[str]:
    """Checkpoints whose ``key`` value did not converge (empty for series without a criterion)."""
    _probe, _metric, _order, _base, sel = _rows(df, key, include_derived)
    bad = _unconverged(sel)
    return [] if bad is None else list(sel["checkpoint"][bad])


def series_frame(
    df, keys: Sequence[str], include_derived: bool = False, include_unconverged: bool = False, allow_mixed: bool = False
):
    """Several :func:`series` side by side as a DataFrame (index: checkpoint). Series measured on
    different data (``data_hash``) raise :class:`AnalysisError` unless ``allow_mixed``."""
    import pandas as pd

    keys = list(dict.fromkeys(keys))
    if not allow_mixed:
        hashes: dict[str, list[str]] = {}
        for k in keys:
            for h in _distinct(_rows(df, k, include_derived)[4], "data_hash"):
                hashes.setdefault(h, []).append(k)
        if len(hashes) > 1:
            raise AnalysisError(
                f"{', '.join(map(repr, keys))} were measured on {len(hashes)} different data sets (data hashes "
                + "; ".join(f"{h[:12]}: {', '.join(ks)}" for h, ks in hashes.items())
                + "); numbers on different token sets are not comparable. Pass allow_mixed=True (CLI: --allow-mixed) "
                "to pool them anyway, or sweep each data set into its own store."
            )
    return pd.concat(
        [
            series(
                df, k, include_derived=include_derived, include_unconverged=include_unconverged, allow_mixed=allow_mixed
            )
            for k in keys
        ],
        axis=1,
    )


def checkpoint_runs(df, index):
    """(run label [n], time order [n] of positions) of the checkpoints in ``index`` (the index of a
    :func:`series_frame` of ``df``): which run each checkpoint belongs to, and the positions sorted
    by run label, then step (then label), so that each run's checkpoints form one time series and
    the order does not depend on the order of the table's rows.
    A table without a ``run`` column is one run."""
    import numpy as np

    q = _run_qualified(df)
    runs = q["run"].astype(str) if "run" in q.columns else None
    key = q.assign(_run=runs if runs is not None else "run").drop_duplicates("checkpoint").set_index("checkpoint")
    missing = [c for c in index if c not in key.index]
    if missing:
        raise AnalysisError(f"checkpoints {missing[:3]} are not in the results table")
    run = key.loc[list(index), "_run"].to_numpy(object)
    step = (
        key.loc[list(index), "step"].astype(float).to_numpy()
        if "step" in key.columns
        else np.arange(len(index), dtype=float)
    )
    pos = np.arange(len(index))
    order = np.array(sorted(pos, key=lambda i: (run[i], np.nan_to_num(step[i], nan=np.inf), str(index[i]))), dtype=int)
    return run, order

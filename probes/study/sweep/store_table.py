"""The tidy results table of a store (:meth:`losslens.study.sweep.store.Store.results`): one row per
checkpoint × probe × spec × metric, with the ``converged`` flag, the ``chosen`` settings and the
``error_warning`` flag (products' measured error over the tolerance) of each value,
and its export to CSV or parquet (:meth:`losslens.study.sweep.store.Store.export`)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

from losslens.measure.probes.registry import PROBES

from losslens.study.sweep.store_errors import StoreError
from losslens.study.sweep.store_schema import FLAGS_IN_EXTRA, RESULT_COLUMNS


def tidy_results(conn: sqlite3.Connection, columns: set[str], include_failed: bool = True):
    """The DataFrame of :meth:`Store.results` read through ``conn`` (``columns``: the results table's
    columns, which stores written before ``converged``/``threads`` existed lack)."""
    import pandas as pd

    opt = ", ".join(f"r.{c}" if c in columns else "NULL" for c in ("converged", "threads"))
    q = (
        "SELECT r.id, r.run, r.checkpoint, c.position, c.step, c.tokens, c.lr, c.derived, r.probe, r.spec, r.metrics, "
        f"r.n_hvp, r.seconds, r.status, r.error, r.seed, r.data_hash, r.plan_hash, r.config_hash, r.extra, {opt} "
        "FROM results r LEFT JOIN checkpoints c ON c.label = r.checkpoint AND c.run = r.run"
    )
    if not include_failed:
        q += " WHERE r.status = 'ok'"
    records = []
    order = {p: i for i, p in enumerate(PROBES)}
    for (
        rid,
        run,
        ckpt,
        pos,
        step,
        tokens,
        lr,
        derived,
        probe,
        spec,
        metrics,
        n_hvp,
        seconds,
        status,
        error,
        seed,
        dh,
        ph,
        ch,
        extra,
        conv,
        threads,
    ) in conn.execute(q):
        base = dict(
            run=run,
            checkpoint=ckpt,
            step=step,
            tokens=tokens,
            lr=lr,
            derived=bool(derived) if derived is not None else False,
            probe=probe,
            n_hvp=n_hvp,
            seconds=seconds,
            status=status,
            error=error,
            seed=seed,
            data_hash=dh,
            threads=threads,
            plan_hash=ph,
            config_hash=ch,
            chosen=chosen_settings(extra),
            error_warning=warning_json(extra),
        )
        key = (pos if pos is not None else 1 << 30, order.get(probe, len(order)), rid)
        ms = json.loads(metrics or "[]")
        if not ms:
            records.append(
                (
                    key,
                    0,
                    {
                        **base,
                        "spec": spec,
                        "metric": None,
                        "value": math.nan,
                        "stderr": math.nan,
                        "ci_low": math.nan,
                        "ci_high": math.nan,
                        "converged": None,
                    },
                )
            )
        flags = _metric_flags(probe, ms, conv, extra)
        for j, m in enumerate(ms):
            records.append(
                (
                    key,
                    j,
                    {
                        **base,
                        "spec": m.get("spec", spec),
                        "metric": m["metric"],
                        "converged": flags[j],
                        **{
                            k: (math.nan if m.get(k) is None else m[k])
                            for k in ("value", "stderr", "ci_low", "ci_high")
                        },
                    },
                )
            )
    records.sort(key=lambda r: (r[0], r[1]))
    df = pd.DataFrame([r[2] for r in records], columns=RESULT_COLUMNS)
    for c in ("step", "tokens", "n_hvp", "seed", "threads"):
        df[c] = df[c].astype("Int64")
    df["converged"] = df["converged"].astype("boolean")
    for c in ("lr", "value", "stderr", "ci_low", "ci_high", "seconds"):
        df[c] = df[c].astype(float)
    df["derived"] = df["derived"].astype(bool)
    return df.reset_index(drop=True)


def export_table(df, path: str | Path) -> Path:
    """Write the tidy table ``df`` to ``path``: ``.csv`` or ``.parquet`` (by suffix); returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        df.to_csv(path, index=False)
    elif suffix in (".parquet", ".pq"):
        try:
            df.to_parquet(path, index=False)
        except ImportError as exc:
            raise StoreError(f"writing parquet needs pyarrow (pip install pyarrow): {exc}") from exc
    else:
        raise StoreError(f"export path {path} must end in .csv or .parquet")
    return path


def chosen_settings(extra: str | dict | None) -> str:
    """The ``chosen`` column of a row: canonical JSON of the numerically relevant settings its
    memory plan chose (``extra["memory"]``) and those it records beside its spec
    (``extra["settings"]``, e.g. ``gptq_variant``), "" when there are none."""
    from losslens.geometry.memory.model import identity_settings

    if isinstance(extra, str):
        try:
            extra = json.loads(extra or "{}")
        except ValueError:
            return ""
    memory = extra.get("memory") if isinstance(extra, dict) else None
    chosen = identity_settings(memory) if isinstance(memory, dict) else {}
    settings = extra.get("settings") if isinstance(extra, dict) else None
    if isinstance(settings, dict):  # settings a probe records beside its spec (a quant row's GPTQ variant)
        chosen = {**chosen, **settings}
    return json.dumps(chosen, sort_keys=True, default=str) if chosen else ""


def warning_json(extra: str | dict | None) -> str:
    """The ``error_warning`` column of a row: canonical JSON of ``extra["error_warning"]`` (its
    products' measured error over the tolerance: rel_error, tolerance, cause, fix, message), "" when
    the row is not flagged."""
    if isinstance(extra, str):
        try:
            extra = json.loads(extra or "{}")
        except ValueError:
            return ""
    warning = extra.get("error_warning") if isinstance(extra, dict) else None
    return json.dumps(warning, sort_keys=True, default=str) if isinstance(warning, dict) and warning else ""


def _metric_flags(probe: str, metrics: list[dict], row_flag, extra: str | None) -> list:
    """Per metric entry: its own ``converged`` flag; else (rows written before per-value flags) the
    eigen/trace flags kept in ``extra``; else the row's flag; None where there is none."""
    old = json.loads(extra or "{}").get("converged") if probe in FLAGS_IN_EXTRA else None
    out = []
    for j, m in enumerate(metrics):
        flag = m.get("converged")
        if flag is None and old is not None:
            flag = (bool(old[j]) if j < len(old) else None) if isinstance(old, list) else bool(old)
        if flag is None and row_flag is not None:
            flag = bool(row_flag)
        out.append(flag)
    return out


__all__ = ["tidy_results", "export_table", "chosen_settings", "warning_json"]

"""The store's SQLite tables (:data:`RESULT_COLUMNS` of the tidy table, the schema, the columns
added since the first release and :func:`migrate`, which adds them to an older store) and the
versions stamped on every row."""

from __future__ import annotations

import datetime as _dt
import functools
import json
import sqlite3
import sys

from losslens.measure.probes.registry import REGISTRY

FIRST_COLUMNS = [
    "run",
    "checkpoint",
    "step",
    "tokens",
    "lr",
    "derived",
    "probe",
    "spec",
    "metric",
    "value",
    "stderr",
    "ci_low",
    "ci_high",
    "n_hvp",
    "seconds",
    "status",
    "error",
    "seed",
    "data_hash",
]
"""The columns of the first release (every row of every store has them): the head of :data:`RESULT_COLUMNS`."""

RESULT_COLUMNS = FIRST_COLUMNS + [
    "converged",
    "threads",
    "plan_hash",
    "config_hash",
    "chosen",
    "error_warning",
]
"""Columns of :meth:`Store.results`, in order (CONTRACT.md). ``converged``: the estimator's flag
for that value (nullable bool; NA when the probe has no stopping criterion). ``chosen``: the
settings the estimator's memory plan chose that can change its numbers (sketch size, basis, block,
...; :func:`losslens.geometry.memory.model.identity_settings` of ``extra["memory"]``) as canonical JSON, ""
when it chose none: with ``config_hash`` it identifies how a value was computed, and analysis
refuses to pool values whose ``chosen`` differ unless ``allow_mixed``. ``error_warning``: the
row's flag when its Hessian products' measured relative error was over the tolerance
(``extra["error_warning"]``, :func:`losslens.lm.models.curvature.error_warning`: rel_error, tolerance,
cause, fix, message) as canonical JSON, "" when the row is not flagged."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    run TEXT NOT NULL DEFAULT '', label TEXT NOT NULL, position INTEGER NOT NULL, step INTEGER, tokens INTEGER, lr REAL,
    derived INTEGER NOT NULL DEFAULT 0, kind TEXT, location TEXT, ref_json TEXT, PRIMARY KEY (run, label));
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    checkpoint TEXT NOT NULL, probe TEXT NOT NULL, spec TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    metrics TEXT NOT NULL DEFAULT '[]', extra TEXT NOT NULL DEFAULT '{}',
    n_hvp INTEGER NOT NULL DEFAULT 0, seconds REAL, error TEXT, seed INTEGER,
    data_hash TEXT, plan_hash TEXT, config_hash TEXT, run TEXT NOT NULL DEFAULT '', versions TEXT, created TEXT,
    converged INTEGER, threads INTEGER,
    UNIQUE (run, checkpoint, probe, spec));
"""
_ADDED_COLUMNS = (("converged", "INTEGER"), ("threads", "INTEGER"))

#: The probes whose rows written before per-value flags kept ``converged`` in ``extra``.
FLAGS_IN_EXTRA: tuple[str, ...] = tuple(p.name for p in REGISTRY if p.flags_in_extra)

_UPSERT_CHECKPOINT = (
    "INSERT INTO checkpoints(run, label, position, step, tokens, lr, derived, kind, location, ref_json) "
    "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(run, label) DO UPDATE SET step=excluded.step, "
    "tokens=COALESCE(excluded.tokens, tokens), lr=COALESCE(excluded.lr, lr), derived=excluded.derived, "
    "kind=excluded.kind, location=excluded.location, ref_json=excluded.ref_json"
)
"""One checkpoint reference of a run, inserted or updated (an unknown tokens / LR keeps the stored value)."""

_UPSERT_RESULT = (
    "INSERT INTO results(checkpoint, probe, spec, status, metrics, extra, n_hvp, seconds, error, seed, "
    "data_hash, plan_hash, config_hash, run, versions, created, converged, threads) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT(run, checkpoint, probe, spec) DO UPDATE SET status=excluded.status, metrics=excluded.metrics, "
    "extra=excluded.extra, n_hvp=excluded.n_hvp, seconds=excluded.seconds, error=excluded.error, "
    "seed=excluded.seed, data_hash=excluded.data_hash, plan_hash=excluded.plan_hash, "
    "config_hash=excluded.config_hash, versions=excluded.versions, created=excluded.created, "
    "converged=excluded.converged, threads=excluded.threads"
)
"""One probe row, inserted or replaced on its unique key ``(run, checkpoint, probe, spec)``."""


def migrate(conn: sqlite3.Connection) -> set[str]:
    """Add the columns newer versions write (converged, threads) to an older store; fill
    ``converged`` from the flags older versions kept in ``extra``. Read-only files are left as
    they are (readers cope with the missing columns). Returns the results table's columns."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(results)")}
    missing = [(c, t) for c, t in _ADDED_COLUMNS if c not in cols]
    if not missing:
        return cols
    try:
        with conn:
            for c, t in missing:
                conn.execute(f"ALTER TABLE results ADD COLUMN {c} {t}")
            fill = []
            marks = ", ".join("?" * len(FLAGS_IN_EXTRA))
            old = conn.execute(f"SELECT id, extra FROM results WHERE probe IN ({marks})", FLAGS_IN_EXTRA)
            for rid, extra in old:
                flag = json.loads(extra or "{}").get("converged")
                if flag is not None:
                    fill.append((int(all(flag) if isinstance(flag, list) else bool(flag)), rid))
            conn.executemany("UPDATE results SET converged = ? WHERE id = ?", fill)
    except sqlite3.OperationalError as exc:
        if "readonly" not in str(exc):
            raise
        return cols
    return cols | {c for c, _ in missing}


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    out = {"python": sys.version.split()[0]}
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("losslens", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return tuple(out.items())


def versions() -> dict[str, str]:
    """Versions of python, losslens, torch, transformers (those installed)."""
    return dict(_versions())


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


__all__ = ["RESULT_COLUMNS", "FIRST_COLUMNS", "FLAGS_IN_EXTRA", "versions", "migrate"]

"""The store's SQLite tables (:data:`RESULT_COLUMNS` of the tidy table, the schema and the columns
added since the first release) and the versions stamped on every row."""
from __future__ import annotations

import datetime as _dt
import functools
import sys

RESULT_COLUMNS = ["run", "checkpoint", "step", "tokens", "lr", "derived", "probe", "spec", "metric", "value",
                  "stderr", "ci_low", "ci_high", "n_hvp", "seconds", "status", "error", "seed", "data_hash",
                  "converged", "threads", "plan_hash", "config_hash", "chosen"]
"""Columns of :meth:`Store.results`, in order (CONTRACT.md). ``converged``: the estimator's flag
for that value (nullable bool; NA when the probe has no stopping criterion). ``chosen``: the
settings the estimator's memory plan chose that can change its numbers (sketch size, basis, block,
...; :func:`geometry.memory.model.identity_settings` of ``extra["memory"]``) as canonical JSON, ""
when it chose none: with ``config_hash`` it identifies how a value was computed, and analysis
refuses to pool values whose ``chosen`` differ unless ``allow_mixed``."""

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


__all__ = ["RESULT_COLUMNS", "versions"]

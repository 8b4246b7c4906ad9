"""Errors of the results store: :class:`StoreError`, SQLite failures turned into it, and the
plan/data check shared by :meth:`Store.bind` and the first write."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any, Mapping

from losslens.geometry.base.errors import LosslensError

__all__ = ["StoreError", "check_plan"]


class StoreError(LosslensError, RuntimeError):
    """The store cannot be used as asked (another plan's store, unreadable file, bad export path)."""


def _db_error(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite failing (directly, or wrapped by pandas.read_sql_query)."""
    return (
        isinstance(exc, sqlite3.DatabaseError)
        or isinstance(exc.__cause__, sqlite3.DatabaseError)
        or (type(exc).__name__ == "DatabaseError" and type(exc).__module__.startswith("pandas"))
    )


def _damaged(path: Path, exc: BaseException) -> StoreError:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "locked" in msg or "busy" in msg:
        return StoreError(
            f"{path} is busy (SQLite: {msg}): another process holds a write transaction; retry when it is done"
        )
    if "readonly" in msg or "read-only" in msg:
        return StoreError(f"{path} is read-only (SQLite: {msg}); copy it somewhere writable, or fix its permissions")
    return StoreError(
        f"{path} is damaged or not a losslens results store (SQLite: {msg}). Restore it from a copy, or "
        f"recover what SQLite can still read: sqlite3 {path} .recover | sqlite3 recovered.sqlite"
    )


def _guarded(method):
    """Turn SQLite errors inside a :class:`Store` method into a :class:`StoreError` naming the file."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            if _db_error(exc):
                raise _damaged(self.path, exc) from exc
            raise

    return wrapper


def check_plan(
    path: Path,
    meta: Mapping[str, Any],
    has_rows: bool,
    plan_hash: str,
    plan_name: str,
    data_hash: str,
    allow_mixed: bool,
) -> None:
    """Refuse a plan or data other than the store's (when it holds rows), unless ``allow_mixed``."""
    old_plan, old_data = meta.get("plan_hash"), meta.get("data_hash")
    if old_plan is None or not has_rows or allow_mixed:
        return
    if old_plan != plan_hash:
        raise StoreError(
            f"{path} holds results of a different plan (hash {old_plan[:12]}, name "
            f"{(meta.get('plan_json') or {}).get('name')!r}); this plan is {plan_hash[:12]} ({plan_name!r}). "
            "Use another --out file, or pass allow_mixed=True (CLI: --allow-mixed) to add to it."
        )
    if old_data is not None and old_data != data_hash:
        raise StoreError(
            f"{path} holds results computed on other data (data hash {old_data[:12]} vs {data_hash[:12]}); "
            "numbers on different token sets are not comparable. Use another --out file, or pass allow_mixed=True "
            "(CLI: --allow-mixed)."
        )

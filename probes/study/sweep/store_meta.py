"""The store's metadata: the entries :meth:`losslens.study.sweep.store.Store.bind` records (plan, data, run,
versions), writing them, and the bind check repeated inside the transaction of the first
:meth:`losslens.study.sweep.store.Store.write`, so two plans racing for one fresh store can never both write."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterator, Mapping

from losslens.geometry.base.jsonable import jsonable

from losslens.study.sweep.plan import Plan
from losslens.study.sweep.store_errors import check_plan
from losslens.study.sweep.store_schema import _now, versions


def write_meta(conn: sqlite3.Connection, items: Mapping[str, Any]) -> None:
    """Insert or replace metadata entries (values JSON-encoded) through ``conn``; the caller owns the transaction."""
    conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        [(k, json.dumps(v, default=jsonable)) for k, v in items.items()],
    )


def binding(
    meta: Mapping[str, Any],
    plan: Plan,
    data_hash: str,
    data_hashes: Mapping[str, str] | None = None,
    allow_mixed: bool = False,
    run: str | None = None,
) -> dict[str, Any]:
    """What a bind records, given the store's metadata ``meta`` as it is: ``{"plan_hash", "plan_name",
    "data_hash", "allow_mixed", "items"}``, ``items`` the metadata entries to write (plan, data, every
    plan hash so far, versions, times, and ``run``, default the plan's name)."""
    hashes = list(meta.get("plan_hashes", []))
    if plan.hash not in hashes:
        hashes.append(plan.hash)
    items = {
        "plan_hash": plan.hash,
        "plan_json": plan.to_dict(),
        "data_hash": data_hash,
        "plan_hashes": hashes,
        "versions": versions(),
        "updated": _now(),
    }
    if data_hashes is not None:
        items["data_hashes"] = dict(data_hashes)
    if "created" not in meta:
        items["created"] = _now()
    items["run"] = run if run is not None else plan.name
    return {
        "plan_hash": plan.hash,
        "plan_name": plan.name,
        "data_hash": data_hash,
        "allow_mixed": allow_mixed,
        "items": items,
    }


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction (the write lock taken at the start): commit or roll back."""
    if conn.in_transaction:
        conn.commit()
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def recheck_binding(conn: sqlite3.Connection, path: Path, bound: Mapping[str, Any]) -> None:
    """Inside the first write's transaction: the bind check of ``bound`` (a :func:`binding`) against the
    store at ``path`` as it is now, and its metadata written again (another writer may have bound the
    store meanwhile; the plan hashes of both are kept)."""
    meta = {
        k: json.loads(v)
        for k, v in conn.execute(
            "SELECT key, value FROM meta WHERE key IN ('plan_hash', 'data_hash', 'plan_json', 'plan_hashes')"
        )
    }
    has_rows = conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] > 0
    check_plan(path, meta, has_rows, bound["plan_hash"], bound["plan_name"], bound["data_hash"], bound["allow_mixed"])
    items = dict(bound["items"])
    items["plan_hashes"] = list(dict.fromkeys([*meta.get("plan_hashes", []), *items["plan_hashes"]]))
    write_meta(conn, items)


__all__ = ["write_meta", "binding", "immediate", "recheck_binding"]

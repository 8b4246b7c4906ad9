"""The results store of a sweep: one SQLite file, one row per checkpoint × probe × spec.

Tables
------
``meta(key, value)``
    ``plan_hash``, ``plan_json``, ``data_hash`` (hash of the three token-set hashes),
    ``data_hashes`` (JSON per set), ``run``, ``created``, ``versions``; ``plan_hashes`` lists every
    plan that wrote rows when mixing was allowed.
``checkpoints(run, label, position, step, tokens, lr, derived, kind, location, ref_json)``
    The trajectories' checkpoint references (derived = LAWA/soup), keyed by ``(run, label)``.
``results(run, checkpoint, probe, spec, status, metrics, extra, n_hvp, seconds, error, seed, ...)``
    Columns ``run, checkpoint, probe, spec, status, metrics, extra, n_hvp, seconds, error, seed, data_hash,
    plan_hash, config_hash, versions, created, converged, threads``, with ``UNIQUE(run, checkpoint, probe, spec)``.
    ``metrics`` is a JSON list of ``{metric, value, stderr, ci_low, ci_high[, spec][, converged]}``
    (an entry's ``spec`` overrides the row's, used by block_trace to hold one trace per group);
    ``extra`` is a JSON object of details (residuals, per-layer errors, ...). ``converged`` is 1/0
    when the probe has a stopping criterion (eigen: every value converged; trace: the Hutchinson
    tolerance), NULL otherwise; ``threads`` is the torch thread count the probe ran with. Stores
    written before these columns existed gain them when opened (converged filled in from ``extra``).

Errors: a file SQLite cannot read (not a database, truncated, damaged pages) raises
:class:`StoreError` with what to do, never a raw ``sqlite3`` error. The plan/data check of
:meth:`Store.bind` is repeated inside the transaction of the first :meth:`Store.write`, so two
plans racing for one fresh store can never both write (one writer per store is also enforced by
the sweep's lock, :mod:`losslens.study.sweep.lock`).

Durability: the database runs in WAL mode and every :meth:`Store.write` is its own transaction
(an UPSERT on the unique key), so a process killed at any moment leaves every finished row intact
and no half-written or duplicate row. A rerun of the same plan skips rows that are ``ok`` and were
computed with the same settings (see :meth:`Store.pending`).

Several runs in one store: every row and checkpoint carries the name of its run (the plan's name,
or ``run_sweep(..., run=...)``), so trajectories whose checkpoints share labels (``step-000100`` in
a WSD and in a cosine run) sit side by side and are compared in one table. The plan/data check of
:meth:`Store.bind` applies to the whole store: runs of one study share the probes and the data.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from losslens.geometry.base.jsonable import jsonable

from losslens.measure.probes.rows import ProbeRow, _f, row_converged
from losslens.measure.probes.tasks import Task

from losslens.study.sweep.plan import Plan
from losslens.study.sweep.store_errors import StoreError, _damaged, _guarded, check_plan as _check_plan
from losslens.study.sweep.store_meta import binding, immediate, recheck_binding, write_meta
from losslens.study.sweep.store_schema import _SCHEMA, _UPSERT_CHECKPOINT, _UPSERT_RESULT, _now, migrate, versions
from losslens.study.sweep.store_schema import RESULT_COLUMNS  # noqa: F401 - the name Store.results' docstring refers to
from losslens.study.sweep.store_table import export_table, tidy_results


class Store:
    """A sweep's SQLite results file. Usable as a context manager; :meth:`close` when done.

    ``Store(path)`` opens (or creates) the file. The executor calls :meth:`bind` with the plan and
    data hash, :meth:`add_checkpoints` with the trajectory, :meth:`pending` to find the work left
    and :meth:`write` once per finished probe. Readers use :meth:`results`, :meth:`export`,
    :attr:`meta`, :attr:`plan`.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"{self.path} is a directory; give a file path such as results.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = None
        self._binding: dict | None = None  # plan/data of the last bind(), checked again by the first write
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=60.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.executescript(_SCHEMA)
            self._columns = migrate(self._conn)
        except sqlite3.DatabaseError as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            err = _damaged(self.path, exc)
            if "file is not a database" in str(exc):
                err = StoreError(
                    f"{self.path} is not a losslens results store (SQLite said: {exc}); give the .sqlite "
                    "file written by `losslens sweep`, or a new path"
                )
            raise err from exc

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"store {self.path} is closed")
        return self._conn

    # ----------------------------------------------------------------- metadata
    @property
    @_guarded
    def meta(self) -> dict[str, Any]:
        """The metadata table; JSON values decoded."""
        out = {}
        for k, v in self.conn.execute("SELECT key, value FROM meta"):
            try:
                out[k] = json.loads(v)
            except ValueError:
                out[k] = v
        return out

    def set_meta(self, items: Mapping[str, Any]) -> None:
        """Insert or replace metadata entries (values JSON-encoded), e.g. the monitor's settings."""
        self._set_meta(items)

    @_guarded
    def _set_meta(self, items: Mapping[str, Any]) -> None:
        with self.conn:
            write_meta(self.conn, items)

    @property
    def plan(self) -> Plan | None:
        """The plan that (last) wrote this store, or None for an empty store."""
        pj = self.meta.get("plan_json")
        return Plan.from_dict(pj) if pj else None

    @_guarded
    def bind(
        self,
        plan: Plan,
        data_hash: str,
        data_hashes: Mapping[str, str] | None = None,
        allow_mixed: bool = False,
        run: str | None = None,
    ) -> None:
        """Record ``plan`` and ``data_hash`` in the metadata, or check that they match it; make
        ``run`` (default: the plan's name) the run that later writes default to.

        Raises :class:`StoreError` when the store was written by a different plan or different
        data, unless ``allow_mixed`` (then both plans' rows live side by side; each row keeps its
        plan and config hash, and rows computed with other settings are recomputed). The same check
        runs again inside the transaction of the next :meth:`write`, together with this metadata,
        so a second writer that bound the store in between cannot mix its rows in.
        """
        meta = self.meta
        has_rows = self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] > 0
        _check_plan(self.path, meta, has_rows, plan.hash, plan.name, data_hash, allow_mixed)
        bound = binding(meta, plan, data_hash, data_hashes, allow_mixed, run)
        self._set_meta(bound["items"])
        self._binding = bound

    # ----------------------------------------------------------------- checkpoints
    @_guarded
    def add_checkpoints(self, refs: Iterable[Any], run: str | None = None) -> None:
        """Record checkpoint references (CheckpointRef-like: label, step, tokens, lr, kind, location)
        of run ``run`` (default: the store's ``run`` metadata, i.e. the bound plan's name). A checkpoint
        already recorded is updated, except that an unknown (None) tokens / LR keeps the stored value
        (a resumed sweep without ``--schedule`` does not erase the LR a scheduled one derived)."""
        run = self._run(run)
        rows = []
        start = self.conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM checkpoints").fetchone()[0]
        stored = self.conn.execute("SELECT label, position, location FROM checkpoints WHERE run = ?", (run,))
        known, where = {}, {}
        for label, position, location in stored:
            known[label], where[label] = position, location
        for i, ref in enumerate(refs):
            label = str(ref.label)
            _same_checkpoint(run, label, where.get(label), _str(getattr(ref, "location", None)))
            pos = known.get(label, start + i)
            d = ref.to_dict() if hasattr(ref, "to_dict") else asdict(ref) if is_dataclass(ref) else dict(vars(ref))
            rows.append(
                (
                    run,
                    label,
                    pos,
                    _int(getattr(ref, "step", None)),
                    _int(getattr(ref, "tokens", None)),
                    _f(getattr(ref, "lr", None)),
                    int(getattr(ref, "kind", None) == "derived"),
                    getattr(ref, "kind", None),
                    _str(getattr(ref, "location", None)),
                    json.dumps(d, default=jsonable),
                )
            )
        with self.conn:
            self.conn.executemany(_UPSERT_CHECKPOINT, rows)

    @_guarded
    def checkpoints(self):
        """The checkpoints table as a DataFrame ordered by position."""
        import pandas as pd

        df = pd.read_sql_query(
            "SELECT run, label, position, step, tokens, lr, derived, kind, location FROM checkpoints ORDER BY position",
            self.conn,
        )
        df["derived"] = df["derived"].astype(bool)
        return df

    # ----------------------------------------------------------------- rows
    @_guarded
    def write(
        self, row: ProbeRow, data_hash: str | None = None, plan_hash: str | None = None, run: str | None = None
    ) -> None:
        """Insert or replace the row for ``(run, checkpoint, probe, spec)`` in one transaction (the
        first write after :meth:`bind` also repeats its plan/data check in that transaction)."""
        if row.status not in ("ok", "failed"):
            raise StoreError(f"row status must be 'ok' or 'failed', got {row.status!r}")
        meta = self.meta if (data_hash is None or plan_hash is None or run is None) else {}
        conv = row_converged(row)
        vals = (
            row.checkpoint,
            row.probe,
            row.spec,
            row.status,
            json.dumps(row.metrics),
            json.dumps(row.extra, default=jsonable),
            int(row.n_hvp or 0),
            _f(row.seconds),
            row.error,
            row.seed,
            data_hash or meta.get("data_hash"),
            plan_hash or meta.get("plan_hash"),
            row.config_hash,
            run or meta.get("run") or "",
            json.dumps(versions()),
            _now(),
            None if conv is None else int(conv),
            None if row.threads is None else int(row.threads),
        )
        if self._binding is not None:
            with immediate(self.conn) as conn:
                recheck_binding(conn, self.path, self._binding)
                self._binding = None
                conn.execute(_UPSERT_RESULT, vals)
            return
        with self.conn:
            self.conn.execute(_UPSERT_RESULT, vals)

    @_guarded
    def existing(self, run: str | None = None) -> dict[tuple[str, str, str], tuple[str, str, str]]:
        """``{(checkpoint, probe, spec): (status, config_hash, data_hash)}`` of every stored row of
        run ``run`` (default: the store's current run)."""
        return {
            (c, p, s): (st, ch or "", dh or "")
            for c, p, s, st, ch, dh in self.conn.execute(
                "SELECT checkpoint, probe, spec, status, config_hash, data_hash FROM results WHERE run = ?",
                (self._run(run),),
            )
        }

    def pending(
        self,
        checkpoint: str,
        tasks: Iterable[Task],
        data_hash: str,
        retry_failed: bool = False,
        existing: Mapping | None = None,
        run: str | None = None,
    ) -> list[Task]:
        """Tasks of ``checkpoint`` (of run ``run``) still to run: not stored, stored with other
        settings or data, or failed when ``retry_failed``. ``ok`` rows with the same settings are skipped."""
        existing = self.existing(run) if existing is None else existing
        out = []
        for t in tasks:
            got = existing.get((checkpoint, t.probe, t.spec))
            if got is None:
                out.append(t)
                continue
            status, cfg, dh = got
            same = cfg == t.config_hash and dh == data_hash
            if not same or (status == "failed" and retry_failed):
                out.append(t)
        return out

    @_guarded
    def failed_rows(self, run: str | None = None) -> dict[tuple[str, str, str], str]:
        """``{(checkpoint, probe, spec): error}`` of the rows of run ``run`` stored as failed."""
        return {
            (c, p, s): e or ""
            for c, p, s, e in self.conn.execute(
                "SELECT checkpoint, probe, spec, error FROM results WHERE run = ? AND status = 'failed'",
                (self._run(run),),
            )
        }

    @_guarded
    def count(self, status: str | None = None) -> int:
        """Number of stored rows (of one status when given)."""
        if status is None:
            return self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM results WHERE status = ?", (status,)).fetchone()[0]

    @_guarded
    def raw(self):
        """The results table as stored (one row per checkpoint × probe × spec; JSON columns as text)."""
        import pandas as pd

        return pd.read_sql_query("SELECT * FROM results ORDER BY id", self.conn)

    @_guarded
    def results(self, include_failed: bool = True):
        """Tidy DataFrame: one row per (checkpoint, probe, spec, metric) with :data:`RESULT_COLUMNS`.

        A failed probe is one row with ``metric``/``value`` missing, ``status='failed'`` and the
        error message. Rows are ordered by checkpoint position, probe (execution order) and
        insertion. ``step``/``tokens``/``n_hvp``/``seed`` are nullable integers, ``derived`` bool.
        """
        return tidy_results(self.conn, self._columns, include_failed)

    def export(self, path: str | Path, include_failed: bool = True) -> Path:
        """Write :meth:`results` to ``path``: ``.csv`` or ``.parquet`` (by suffix)."""
        return export_table(self.results(include_failed=include_failed), path)

    @_guarded
    def runs(self) -> list[str]:
        """Names of the runs with checkpoints in this store, in the order they were added."""
        return [r[0] for r in self.conn.execute("SELECT run FROM checkpoints GROUP BY run ORDER BY MIN(position)")]

    def _run(self, run: str | None) -> str:
        return str(run) if run is not None else str(self.meta.get("run") or "")

    @_guarded
    def summary(self) -> dict[str, int]:
        """Row counts: ``{"ok": n, "failed": m, "checkpoints": c}``."""
        return {
            "ok": self.count("ok"),
            "failed": self.count("failed"),
            "checkpoints": self.conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0],
        }


def _int(x):
    return None if x is None else int(x)


def _str(x):
    return None if x is None else str(x)


__all__ = ["Store"]


def _same_checkpoint(run: str, label: str, stored: str | None, new: str | None) -> None:
    """Refuse a second trajectory under one run name: its checkpoints' labels (``step-000000`` in every
    fork) would match the first one's rows, and a resumed sweep would keep those rows as this
    trajectory's numbers. A stored folder that no longer exists is taken as moved (resuming after a
    move is allowed)."""
    if stored is None or new is None or stored == new:
        return
    if Path(new).resolve() == Path(stored).resolve():
        return
    moved = not stored.startswith("hf:") and not Path(stored).exists()
    if moved:
        return
    raise StoreError(
        f"run {run!r} of this store holds checkpoint {label} from {stored}, not {new}: give each "
        "trajectory its own run name (losslens sweep --run NAME; run_sweep(..., SweepOptions(run=NAME))), "
        "or write this one to another store"
    )

"""Sweeps along a trajectory: a plan of probes, a resumable SQLite store, local and Ray executors.

    from losslens.study.sweep import Plan, Store, run_sweep
    run_sweep("runs/wsd", Plan.default(), out="wsd.sqlite")     # kill it, rerun it: it resumes
    df = Store("wsd.sqlite").results()                          # tidy table (see store.RESULT_COLUMNS)

See :mod:`.plan` (what to measure; each probe is a module of :mod:`losslens.measure.probes`), :mod:`.store`
(where rows go; :mod:`.store_errors` its errors, :mod:`.store_schema` its tables,
:mod:`.store_meta` its metadata and the plan/data check, :mod:`.store_table` the tidy table), :mod:`.lock` (one
writer per store), :mod:`.runner` (one checkpoint's probes), :mod:`.executor` (:func:`run_sweep`),
:mod:`.options` (:class:`SweepOptions`), :mod:`.outcome` (:class:`SweepReport`, exit statuses),
:mod:`.executors` (local, Ray, data-parallel followers), :mod:`.local_workers` (the local
executor's worker processes), :mod:`.data_parallel` (data-parallel ranks: their group and data),
:mod:`.datasets` (the token sets) and :mod:`.progress` (the progress display).
"""

from losslens.study.sweep.datasets import build_data, data_hashes
from losslens.study.sweep.executor import resolve_trajectory, run_sweep
from losslens.study.sweep.lock import StoreLock, StoreLockedError
from losslens.study.sweep.options import EXECUTORS, SweepOptions
from losslens.study.sweep.outcome import EXIT_ALL_FAILED, EXIT_SOME_FAILED, SweepError, SweepReport
from losslens.measure.probes.accuracy import AccuracyProbe
from losslens.measure.probes.block_trace import BlockTraceProbe
from losslens.measure.probes.eigen import EigenProbe
from losslens.measure.probes.explain import ExplainProbe
from losslens.measure.probes.trace import TraceProbe
from losslens.study.sweep.plan import PROBES, DataSpec, Plan, PlanError, Task, load_plan
from losslens.study.sweep.runner import probe_checkpoint
from losslens.study.sweep.store import Store
from losslens.study.sweep.store_errors import StoreError
from losslens.study.sweep.store_schema import RESULT_COLUMNS

__all__ = [
    "Plan",
    "PlanError",
    "AccuracyProbe",
    "TraceProbe",
    "EigenProbe",
    "BlockTraceProbe",
    "ExplainProbe",
    "DataSpec",
    "Task",
    "PROBES",
    "load_plan",
    "Store",
    "StoreError",
    "RESULT_COLUMNS",
    "run_sweep",
    "SweepOptions",
    "SweepReport",
    "SweepError",
    "EXECUTORS",
    "EXIT_SOME_FAILED",
    "EXIT_ALL_FAILED",
    "build_data",
    "data_hashes",
    "resolve_trajectory",
    "StoreLock",
    "StoreLockedError",
    "probe_checkpoint",
]

"""Sweeps along a trajectory: a plan of probes, a resumable SQLite store, local and Ray executors.

    from probes.sweep import Plan, Store, run_sweep
    run_sweep("runs/wsd", Plan.default(), out="wsd.sqlite")     # kill it, rerun it: it resumes
    df = Store("wsd.sqlite").results()                          # tidy table (see store.RESULT_COLUMNS)

See :mod:`.plan` (what to measure; each probe is a module of :mod:`probes.sweep_probes`), :mod:`.store`
(where rows go; :mod:`.store_errors` its errors, :mod:`.store_schema` its tables), :mod:`.lock` (one
writer per store), :mod:`.runner` (one checkpoint's probes), :mod:`.executor` (:func:`run_sweep`),
:mod:`.options` (:class:`SweepOptions`), :mod:`.outcome` (:class:`SweepReport`, exit statuses),
:mod:`.executors` (local, Ray, data-parallel followers), :mod:`.local_workers` (the local
executor's worker processes), :mod:`.data_parallel` (data-parallel ranks: their group and data),
:mod:`.datasets` (the token sets) and :mod:`.progress` (the progress display).
"""
from .datasets import build_data, data_hashes
from .executor import resolve_trajectory, run_sweep
from .lock import StoreLock, StoreLockedError
from .options import EXECUTORS, SweepOptions
from .outcome import EXIT_ALL_FAILED, EXIT_SOME_FAILED, SweepError, SweepReport
from .plan import PROBES, AccuracyProbe, BlockTraceProbe, DataSpec, EigenProbe, ExplainProbe, Plan, PlanError, Task, TraceProbe, load_plan
from .runner import probe_checkpoint
from .store import Store
from .store_errors import StoreError
from .store_schema import RESULT_COLUMNS

__all__ = [
    "Plan", "PlanError", "AccuracyProbe", "TraceProbe", "EigenProbe", "BlockTraceProbe", "ExplainProbe", "DataSpec", "Task", "PROBES", "load_plan",
    "Store", "StoreError", "RESULT_COLUMNS",
    "run_sweep", "SweepOptions", "SweepReport", "SweepError", "EXECUTORS", "EXIT_SOME_FAILED", "EXIT_ALL_FAILED", "build_data",
    "data_hashes", "resolve_trajectory", "StoreLock", "StoreLockedError",
    "probe_checkpoint",
]

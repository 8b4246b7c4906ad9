"""Sweeps along a trajectory: a plan of probes, a resumable SQLite store, local and Ray executors.

    from probes.sweep import Plan, Store, run_sweep
    run_sweep("runs/wsd", Plan.default(), out="wsd.sqlite")     # kill it, rerun it: it resumes
    df = Store("wsd.sqlite").results()                          # tidy table (see store.RESULT_COLUMNS)

See :mod:`.plan` (what to measure), :mod:`.rows` (what a row holds), :mod:`.store` (where rows
go; :mod:`.store_errors` its errors), :mod:`.lock` (one writer per store), :mod:`.runner` (what
each probe computes), :mod:`.executor` (how checkpoints are scheduled; exit statuses) and
:mod:`.parallel` (the local executor's worker processes).
"""
from .executor import (EXECUTORS, EXIT_ALL_FAILED, EXIT_SOME_FAILED, SweepError, SweepReport, build_data, data_hashes,
                       resolve_trajectory, run_sweep)
from .lock import StoreLock, StoreLockedError
from .plan import PROBES, AccuracyProbe, BlockTraceProbe, DataSpec, EigenProbe, ExplainProbe, Plan, PlanError, Task, TraceProbe, load_plan
from .runner import probe_checkpoint
from .store import RESULT_COLUMNS, Store, StoreError

__all__ = [
    "Plan", "PlanError", "AccuracyProbe", "TraceProbe", "EigenProbe", "BlockTraceProbe", "ExplainProbe", "DataSpec", "Task", "PROBES", "load_plan",
    "Store", "StoreError", "RESULT_COLUMNS",
    "run_sweep", "SweepReport", "SweepError", "EXECUTORS", "EXIT_SOME_FAILED", "EXIT_ALL_FAILED", "build_data",
    "data_hashes", "resolve_trajectory", "StoreLock", "StoreLockedError",
    "probe_checkpoint",
]

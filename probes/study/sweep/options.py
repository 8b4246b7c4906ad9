"""How a sweep runs, as one value: :class:`SweepOptions` (:func:`losslens.study.sweep.run_sweep` takes it, or
its fields as keywords)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class SweepOptions:
    """The options of one :func:`~losslens.study.sweep.executor.run_sweep` call (none changes a number).

    - ``executor``: 'local' or 'ray'. ``address``: Ray cluster address ('auto', 'ray://…'); None
      starts a local cluster with ``num_workers`` CPUs. ``num_gpus`` per Ray task: default 1 when
      the cluster has GPUs, else 0.
    - ``num_workers``: local: worker processes, each probing whole checkpoints with its own model
      (N workers need N × the memory of one; refused up front when N models clearly exceed the
      available memory). Default ``$LOSSLENS_WORKERS``, else the cores (÷ ``num_threads``), but 1
      on CUDA; never more than the checkpoints to probe; 1 runs in this process. Ray: CPUs of the
      local cluster it starts.
    - ``pool``: a :class:`losslens.lm.core.workers.WorkerPool` to run the local sweep on (left open, so
      several sweeps share its workers; ``num_workers`` is then its size).
    - ``retry_failed``: rerun rows stored as failed (otherwise they are kept and skipped).
    - ``allow_mixed``: accept a store written by another plan/data (rows keep their plan hash; rows
      computed with other settings are recomputed).
    - ``token_sets``: ``{"eval", "calibration", "curvature": TokenSet}`` to use instead of building them.
    - ``progress``: show the rich progress display (False: quiet).
    - ``num_threads``: torch intra-op threads while probing (local: this process, restored after, or
      each worker; ray: each task). None: the cores shared out between local workers (1 each when
      there is one worker per core), torch's default with one local process (Ray workers get 1 per
      CPU requested). Small models run fastest with 1 thread; a machine shared with other jobs can
      slow multi-threaded torch down by an order of magnitude (oversubscription).
    - ``device``, ``dtype``: where/how checkpoints are loaded (default: the loader's; CUDA when present).
    - ``on_row``: called with each row after it is committed.
    - ``run``: name of this trajectory's run in the store (default: the plan's name). One store can
      hold several runs (e.g. a WSD and a cosine trajectory) as long as they share plan and data.
    - ``wait``: when another sweep holds the store's writer lock (:mod:`losslens.study.sweep.lock`), wait for
      it (``on_wait(holder)`` is called once first) instead of raising
      :class:`~losslens.study.sweep.lock.StoreLockedError`.
    - ``allow_pickle``: load ``.bin``/``.pt`` checkpoints that need full pickle (only for trusted files).
    - ``parallel``: ``"data"`` inside an initialised ``torch.distributed`` group (``torchrun … sweep
      --parallel data``): every rank probes every checkpoint with one process (local executor), the
      curvature batches split over the ranks (:mod:`losslens.geometry.operators.data_parallel`); rank 0 alone
      takes the store's lock, decides what is left to do (resumable as always), writes the rows and
      reports; the other ranks return a report of the rows they computed.
    """

    executor: str = "local"
    address: str | None = None
    retry_failed: bool = False
    allow_mixed: bool = False
    token_sets: Mapping[str, Any] | None = None
    progress: bool = True
    device: Any = None
    dtype: Any = None
    num_workers: int | None = None
    num_gpus: float | None = None
    num_threads: int | None = None
    on_row: Callable[[Any], None] | None = None
    run: str | None = None
    wait: bool = False
    on_wait: Callable[[dict], None] | None = None
    allow_pickle: bool = False
    pool: Any = None
    parallel: str = "none"

    def with_overrides(self, **overrides) -> "SweepOptions":
        """A copy with ``overrides`` (field names); an unknown name raises TypeError naming the valid ones."""
        valid = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise TypeError(f"run_sweep() got unknown option(s) {unknown}; valid: {', '.join(sorted(valid))}")
        return replace(self, **overrides) if overrides else self


__all__ = ["SweepOptions", "EXECUTORS"]

"""What a sweep does with one checkpoint (the unit of work of every executor).

:func:`probe_checkpoint` loads one checkpoint into a reused model (:class:`CheckpointLoader`) and
runs the pending :class:`~losslens.measure.probes.tasks.Task` s in plan order, yielding one
:class:`~losslens.measure.probes.rows.ProbeRow` per task as soon as it finishes. A probe that raises
gives a ``failed`` row with the error and the next probe runs; a checkpoint that cannot be loaded
gives a failed row for each of its tasks. What each probe computes, and its metrics, is in its own
module of :mod:`losslens.measure.probes`; what probes of one checkpoint share is
:class:`~losslens.measure.probes.state.CheckpointState`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from losslens.lm.core.worker_loop import short_error as _short_error
from losslens.measure.probes.registry import REGISTRY
from losslens.measure.probes.rows import ProbeRow
from losslens.measure.probes.state import CheckpointState, ProbeError
from losslens.measure.probes.tasks import Task

from losslens.study.sweep.plan import Plan

#: The function that computes each probe's rows, by probe name (from the registry).
PROBE_FUNCS: dict[str, Callable[[CheckpointState, Task], ProbeRow]] = {p.name: p.run for p in REGISTRY}


# --------------------------------------------------------------------------- driver of one checkpoint
def probe_checkpoint(
    ref,
    tasks: Iterable[Task],
    plan: Plan,
    token_sets: Mapping[str, Any],
    loader,
    on_start: Callable[[str, Task], None] | None = None,
    parallel=None,
    on_products: Callable[[int], None] | None = None,
) -> Iterator[ProbeRow]:
    """Run ``tasks`` on checkpoint ``ref``; yield one row per task as it finishes.

    ``loader``: a :class:`losslens.lm.checkpoints.CheckpointLoader` (reused across checkpoints).
    ``on_start(label, task)`` is called before each probe (for progress displays), ``on_products(n)``
    after every ``n`` Hessian-vector products of the checkpoint's curvature operator. The first row
    carries ``extra["load_seconds"]`` (loading the weights). Rows carry the wall time of their probe
    (the FP evaluation is charged to the probe that first needs it) and the torch thread count.
    ``parallel``: a :class:`~losslens.geometry.operators.data_parallel.DataParallel` when every rank of a process
    group runs the same tasks (``sweep --parallel data``): the Hessian operator's batches are split
    over the ranks, and a checkpoint that fails to load on any rank fails on all of them.
    """
    import torch

    tasks = list(tasks)
    label = str(ref.label)
    if not tasks:
        return
    t0 = time.perf_counter()
    try:
        model = loader.load(ref)
        for p in model.parameters():
            p.requires_grad_(True)
        model.eval()
        _check_vocabulary(model, token_sets, label)
    except Exception as exc:  # corrupt or missing weights: every task of this checkpoint fails
        err = f"loading checkpoint {label!r} failed: {_short_error(exc)}"
    else:
        err = None
    if parallel is not None:  # the ranks agree, so none goes on to a collective alone
        errors = parallel.gather_objects(err)
        failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None]
        err = "; ".join(failed) if failed else None
    if err is not None:
        dt = time.perf_counter() - t0
        for t in tasks:
            row = ProbeRow.failed(label, t, err, seconds=dt)
            row.threads = torch.get_num_threads()
            yield row
        return
    load_seconds = time.perf_counter() - t0
    st = CheckpointState(model, plan, token_sets, parallel)
    st.label = label
    st.ref = ref
    st.on_products = on_products
    first = True
    for t in tasks:
        if on_start is not None:
            on_start(label, t)
        t1 = time.perf_counter()
        try:
            row = PROBE_FUNCS[t.probe](st, t)
            _check_finite(row)
        except Exception as exc:
            row = ProbeRow.failed(label, t, _short_error(exc))
        row.seconds = time.perf_counter() - t1
        row.config_hash = t.config_hash
        row.checkpoint = label
        row.threads = torch.get_num_threads()
        if row.seed is None:
            row.seed = plan.seed
        if first:
            row.extra = {**row.extra, "load_seconds": load_seconds}
            first = False
        yield row
    del st


def _check_vocabulary(model, token_sets: Mapping[str, Any], label: str) -> None:
    """Token ids beyond the checkpoint's vocabulary (data built with another checkpoint's
    tokenizer, e.g. a stray model in the folder) would fail deep inside the embedding."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(emb, "num_embeddings", None)
    if vocab is None:
        return
    top = max(
        (
            int(ts.tokens.max())
            for ts in token_sets.values()
            if getattr(ts, "tokens", None) is not None and ts.tokens.numel()
        ),
        default=-1,
    )
    if top >= vocab:
        raise ProbeError(
            f"checkpoint {label!r} has a vocabulary of {vocab} tokens but the sweep's token sets hold ids up to "
            f"{top} (built with another checkpoint's tokenizer); sweep this checkpoint on its own data"
        )


def _check_finite(row: ProbeRow) -> None:
    bad = [m["metric"] for m in row.metrics if m["value"] is None or not math.isfinite(m["value"])]
    if bad:
        raise ProbeError(f"{row.probe} {row.spec}: non-finite value for {bad}; the weights or data are broken")


# --------------------------------------------------------------------------- loaders (one per process)
_LOADERS: dict[Any, Any] = {}


def get_loader(trajectory, device=None, dtype=None, allow_pickle: bool = False):
    """A :class:`CheckpointLoader` for ``trajectory``, cached per process (one model instance reused)."""
    from losslens.lm.checkpoints import CheckpointLoader

    first = trajectory[0] if len(trajectory) else None
    key = (
        getattr(trajectory, "name", None),
        str(getattr(first, "location", None)),
        str(device),
        str(dtype),
        allow_pickle,
    )
    loader = _LOADERS.get(key)
    if loader is None:
        _LOADERS.clear()  # one model in memory per process
        loader = CheckpointLoader(trajectory, dtype=dtype, device=device, allow_pickle=allow_pickle)
        _LOADERS[key] = loader
    else:
        # the trajectory may have gained derived checkpoints since; let the loader know them (a loader
        # that cannot take them would load a stale trajectory: that is a bug, and it is raised)
        if hasattr(loader, "trajectory"):
            loader.trajectory = trajectory
    return loader


__all__ = ["probe_checkpoint", "PROBE_FUNCS", "get_loader"]

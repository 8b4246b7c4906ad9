"""What each probe computes on one checkpoint (the unit of work of every executor).

:func:`probe_checkpoint` loads one checkpoint into a reused model (:class:`CheckpointLoader`) and
runs the pending :class:`~probes.sweep.plan.Task` s in plan order, yielding one
:class:`~probes.sweep.store.ProbeRow` per task as soon as it finishes. A probe that raises gives a
``failed`` row with the error and the next probe runs; a checkpoint that cannot be loaded gives a
failed row for each of its tasks.

Per checkpoint, shared between probes:

* the FP loss on the eval set is computed once (by the ``loss`` probe or the first ``quant``
  probe) and reused as ``fp_loss`` for every quantizer spec;
* one :class:`geometry.operators.hessian.HessianOperator` of :func:`probes.core.lm.lm_loss` on the curvature set,
  w.r.t. ``plan.curvature_params``, serves trace, eigen and block_trace.

Metrics per probe (docs/science.md §2, §4, §6):

=============  ================  ===========================================================
probe          spec              metrics (extra)
=============  ================  ===========================================================
loss           ""                loss (nats, eval set), ppl  (n_tokens)
quant          quantizer spec    q_loss, rel_loss_error, ppl_gap  (fp_loss, q_ppl, layer_errors,
                                 kurtosis of θ̂, quant_seconds, notes)
directional    quantizer spec    gTd, dHd, pred_delta = gTd + dHd/2, actual_delta = L(θ̂) − L(θ),
                                 all on the curvature set, w.r.t. the quantized matrices (δ = θ̂ − θ
                                 is zero elsewhere, so this equals the full-space value)
trace          hutch++|hutchin.  trace (stderr, 95% CI; converged flag)
eigen          top{k}            lambda_1..lambda_k, each with its converged flag (residuals, converged,
                                 iterations = Lanczos steps or power iterations actually taken)
block_trace    groups name       trace per group (the tidy table's spec = group name)
kurtosis       ""                pooled weight excess kurtosis of the quantized matrices (per_matrix)
accuracy       fp|spec[@task]    acc (± stderr, 95% CI), acc_norm; for a spec delta_acc = acc_q − acc_fp and
                                 rel_drop with paired bootstrap CIs (McNemar p); no @task: mean over tasks
                                 (probes.accuracy; lm-eval on the in-memory model, FP scored once)
explain        quantizer spec    actual_delta, rel_delta, gTd, quadratic = dHd/2, pred_delta, remainder,
                                 norm2, trace (CI), trace_per_param (CI), rayleigh, kappa (CI), loss,
                                 q_loss; per block dHd[part:block], gTd[...], norm2[...], within[...]
                                 (probes.explain; on the curvature set, δ-space = quantized matrices)
=============  ================  ===========================================================

A ``directional`` and an ``explain`` row of the same spec share one measurement of δ (quantizer,
gradient, HVP, loss of θ̂: :meth:`CheckpointState.direction`); the explain probe's trace of the
quantized matrices is estimated once per checkpoint and shared by its specs (and taken from the
``trace`` probe when that ran on the same parameters with the same method, budget and seed).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

if TYPE_CHECKING:  # torch is imported lazily so that `losslens --help` stays fast
    import torch

from probes.core.workers import short_error as _short_error

from .plan import Plan, Task
from .store import ProbeRow, metric


class ProbeError(RuntimeError):
    """A probe could not run (missing data set, unsupported option)."""


class CheckpointState:
    """One loaded checkpoint and what its probes share (FP loss, the Hessian operator)."""

    def __init__(self, model: torch.nn.Module, plan: Plan, token_sets: Mapping[str, Any], parallel=None):
        self.model = model
        self.parallel = parallel  # a geometry.operators.data_parallel.DataParallel: the curvature batches are split
        self.plan = plan
        self.token_sets = token_sets
        self._fp = None
        self._op = None
        self._directions: dict[str, Any] = {}
        self._accuracy: dict[str, Any] = {}
        self.traces: dict[tuple, Any] = {}  # (parameter names, method, HVPs, seed) -> TraceEstimate

    def data(self, name: str):
        ts = self.token_sets.get(name)
        if ts is None:
            raise ProbeError(f"the plan needs the {name!r} token set; it was not built/passed")
        return ts

    def fp_loss(self):
        """:class:`probes.core.lm.LossResult` of the FP model on the eval set (computed once)."""
        if self._fp is None:
            from probes.core.lm import evaluate

            self._fp = evaluate(self.model, self.data("eval"))
        return self._fp

    def hessian(self):
        """The shared :class:`HessianOperator` on the curvature set (built once)."""
        if self._op is None:
            from probes.models.curvature import lm_hessian

            batches, extra = list(self.data("curvature")), {}
            if self.parallel is not None:  # this rank's share; products all-reduced over the ranks
                from geometry.operators.data_parallel import split_batches

                batches = split_batches(batches, self.parallel.rank, self.parallel.world_size)
                extra = {"data_parallel": self.parallel}
            self._op = lm_hessian(self.model, batches, params=self.plan.curvature_params,
                                  max_memory=self.plan.max_memory, backend=self.plan.backend,
                                  compute_dtype=self.plan.compute_dtype, **extra)
        return self._op

    def direction(self, spec: str):
        """The :class:`probes.explain.DirectionMeasure` of quantizer ``spec`` (numbers only, measured
        once per checkpoint; with the within-block parts the plan's explain probe asks for)."""
        if spec not in self._directions:
            from probes.explain import measure_direction

            e = self.plan.explain
            within = e.blocks if e is not None and e.within and spec in e.specs else ()
            trace = (e.trace_method, e.trace_matvecs) if e is not None and spec in e.specs else None
            self._directions[spec] = measure_direction(self.model, spec, list(self.data("curvature")),
                                                       self.token_sets.get("calibration"), self.plan.quant_modules, within,
                                                       max_memory=self.plan.max_memory, plan_trace=trace,
                                                       backend=self.plan.backend, compute_dtype=self.plan.compute_dtype)
        return self._directions[spec]


    def accuracy(self, variant: str):
        """The :class:`probes.accuracy.AccuracyReport` of ``fp`` or a quantizer spec (with FP), scored
        once per checkpoint; FP's scores are shared by every spec (the same items, paired)."""
        if variant not in self._accuracy:
            from probes.accuracy.api import FP, evaluate_variants
            from probes.accuracy.harness import prepared_once
            from probes.accuracy.selection import select_tasks
            from probes.data import load_tokenizer

            a = self.plan.accuracy
            if getattr(self, "tokenizer", None) is None:
                self.tokenizer = load_tokenizer(self.ref)
            sel = select_tasks(list(a.tasks))
            prep = prepared_once(sel, a.limit, a.num_fewshot, a.seed)
            fp = self._accuracy[FP].scores[FP] if FP in self._accuracy else None
            specs = () if variant == FP else (variant,)
            self._accuracy[variant] = evaluate_variants(
                self.model, self.tokenizer, sel, specs, self.token_sets.get("calibration"), self.plan.quant_modules,
                a.limit, a.num_fewshot, a.seed, a.batch_size, a.n_boot, fp_scores=fp, prepared=prep)
            if FP not in self._accuracy:
                self._accuracy[FP] = self._accuracy[variant]
        return self._accuracy[variant]


# --------------------------------------------------------------------------- probes
def _accuracy(st: CheckpointState, task: Task) -> ProbeRow:
    from probes.accuracy.rows import row_values, split_spec

    variant, name = split_spec(task.spec)
    ms, extra = row_values(st.accuracy(variant), variant, name)
    return ProbeRow(st_label(st), "accuracy", task.spec, metrics=[metric(*m) for m in ms], extra=extra,
                    seed=task.opts["seed"])


def _loss(st: CheckpointState, task: Task) -> ProbeRow:
    r = st.fp_loss()
    return ProbeRow(st_label(st), "loss", "", metrics=[metric("loss", r.loss), metric("ppl", r.ppl)],
                    extra={"n_tokens": r.n_tokens, "eval_seconds": r.seconds})


def _quant(st: CheckpointState, task: Task) -> ProbeRow:
    from probes.quant import quantization_error

    fp = st.fp_loss()
    e = quantization_error(st.model, task.spec, st.data("eval"), calibration=st.token_sets.get("calibration"),
                           modules=st.plan.quant_modules, fp_loss=fp.loss)
    return ProbeRow(st_label(st), "quant", task.spec,
                    metrics=[metric("q_loss", e.q_loss), metric("rel_loss_error", e.rel_loss_error), metric("ppl_gap", e.ppl_gap)],
                    extra={"fp_loss": e.fp_loss, "q_ppl": e.q_ppl, "fp_ppl": e.fp_ppl, "layer_errors": dict(e.layer_errors),
                           "kurtosis_quantized": e.kurtosis, "quant_seconds": e.quant_seconds, "notes": list(e.notes)})


def _directional(st: CheckpointState, task: Task) -> ProbeRow:
    m = st.direction(task.spec)
    p = m.parts
    gTd, dHd, norm2 = p.total_gTd, p.total_dHd, p.total_norm2
    return ProbeRow(st_label(st), "directional", task.spec,
                    metrics=[metric("gTd", gTd), metric("dHd", dHd), metric("pred_delta", gTd + 0.5 * dHd),
                             metric("actual_delta", m.actual)],
                    extra={"loss": m.loss, "q_loss": m.q_loss, "direction_norm": math.sqrt(norm2),
                           "curvature": dHd / norm2 if norm2 > 0 else math.nan, "n_params": p.dim, "memory": p.memory},
                    n_hvp=int(p.num_matvecs))


def _explain(st: CheckpointState, task: Task) -> ProbeRow:
    from probes.explain import direction_trace, row_metrics

    o = task.opts
    fresh = task.spec not in st._directions
    m = st.direction(task.spec)
    key = (m.names, o["trace_method"], o["trace_matvecs"], o["seed"])
    trace, spent = st.traces.get(key), 0
    if trace is None:
        trace = direction_trace(st.model, m.names, list(st.data("curvature")), o["trace_matvecs"], o["trace_method"], o["seed"],
                                st.plan.max_memory)
        st.traces[key], spent = trace, int(trace.num_matvecs)
    ms = [metric(*t) for t in row_metrics(m, trace, st.model, o["blocks"])]
    return ProbeRow(st_label(st), "explain", task.spec, metrics=ms,
                    extra={"dim": m.parts.dim, "trace_method": trace.method, "trace_hvps": int(trace.num_matvecs),
                           "trace_estimated_here": bool(spent), "direction_shared": not fresh,
                           "layer_errors": dict(m.layer_errors), "within_hvps": m.within_matvecs, "memory": trace.memory},
                    n_hvp=spent + m.within_matvecs + (int(m.parts.num_matvecs) if fresh else 0), seed=o["seed"])


def _trace(st: CheckpointState, task: Task) -> ProbeRow:
    from geometry.estimators.trace import hutchinson_trace, hutchpp_trace

    o = task.opts
    op = st.hessian()
    if task.spec == "hutch++":
        est = hutchpp_trace(op, num_matvecs=o["num_matvecs"], seed=o["seed"])
    else:
        est = hutchinson_trace(op, num_matvecs=o["num_matvecs"], seed=o["seed"])
    st.traces[(tuple(op.space.names), task.spec, o["num_matvecs"], o["seed"])] = est
    return ProbeRow(st_label(st), "trace", task.spec,
                    metrics=[metric("trace", est.value, est.stderr, est.ci_low, est.ci_high, converged=est.converged)],
                    extra={"method": est.method, "dim": op.dim, "rel_stderr": est.rel_stderr, "converged": bool(est.converged),
                           "memory": est.memory},
                    n_hvp=int(est.num_matvecs), seed=o["seed"])


def _eigen(st: CheckpointState, task: Task) -> ProbeRow:
    from geometry.estimators.eigen import top_eigenvalues

    o = task.opts
    res = top_eigenvalues(st.hessian(), k=o["k"], method=o["method"], tol=o["tol"], max_iter=o["max_iter"], seed=o["seed"])
    return ProbeRow(st_label(st), "eigen", task.spec,
                    metrics=[metric(f"lambda_{i + 1}", v, converged=c) for i, (v, c) in enumerate(zip(res.values, res.converged))],
                    extra={"residuals": [float(x) for x in res.residuals], "converged": [bool(c) for c in res.converged],
                           "iterations": int(res.iterations), "method": res.method, "memory": res.memory},
                    n_hvp=int(res.num_matvecs), seed=o["seed"])


def _block_groups(model: torch.nn.Module, groups):
    if groups != "block":
        return groups if isinstance(groups, str) else {k: list(v) for k, v in (groups.items() if isinstance(groups, Mapping) else groups)}
    from probes.core.modules import find_blocks

    prefix, blocks = find_blocks(model)
    return {f"block{i}": f"{_escape_glob(prefix)}.{i}.*" for i in range(len(blocks))}


def _block_trace(st: CheckpointState, task: Task) -> ProbeRow:
    from geometry.estimators.trace import block_traces

    o = task.opts
    groups = o["groups"]
    if isinstance(groups, tuple):  # frozen mapping
        groups = {k: list(v) for k, v in groups}
    res = block_traces(st.hessian(), _block_groups(st.model, groups), num_matvecs=o["num_matvecs"], seed=o["seed"])
    ms = [metric("trace", res.values[g], res.stderr[g], res.ci_low[g], res.ci_high[g], spec=g) for g in res.values]
    return ProbeRow(st_label(st), "block_trace", task.spec, metrics=ms,
                    extra={"sizes": dict(res.sizes), "total": float(res.total.value), "total_stderr": float(res.total.stderr),
                           "memory": res.total.memory},
                    n_hvp=int(res.num_matvecs), seed=o["seed"])


def _kurtosis(st: CheckpointState, task: Task) -> ProbeRow:
    from probes.models.weights import weight_kurtosis

    k = weight_kurtosis(st.model, st.plan.quant_modules)
    return ProbeRow(st_label(st), "kurtosis", "", metrics=[metric("pooled", k.pooled)],
                    extra={"per_matrix": {n: float(v) for n, v in dict(k.per_matrix).items()}})


#: The function that computes each probe's rows, by probe name.
PROBE_FUNCS: dict[str, Callable[[CheckpointState, Task], ProbeRow]] = {
    "loss": _loss, "quant": _quant, "directional": _directional, "trace": _trace, "eigen": _eigen,
    "block_trace": _block_trace, "kurtosis": _kurtosis, "explain": _explain, "accuracy": _accuracy,
}


def st_label(st: CheckpointState) -> str:
    return getattr(st, "label", "")


def _escape_glob(name: str) -> str:
    """A literal name as an fnmatch glob (brackets escaped)."""
    from geometry.base.params import literal_glob

    return literal_glob(name)


# --------------------------------------------------------------------------- driver of one checkpoint
def probe_checkpoint(ref, tasks: Iterable[Task], plan: Plan, token_sets: Mapping[str, Any], loader,
                     on_start: Callable[[str, Task], None] | None = None, parallel=None) -> Iterator[ProbeRow]:
    """Run ``tasks`` on checkpoint ``ref``; yield one row per task as it finishes.

    ``loader``: a :class:`probes.checkpoints.CheckpointLoader` (reused across checkpoints).
    ``on_start(label, task)`` is called before each probe (for progress displays). The first row
    carries ``extra["load_seconds"]`` (loading the weights). Rows carry the wall time of their probe
    (the FP evaluation is charged to the probe that first needs it) and the torch thread count.
    ``parallel``: a :class:`~geometry.operators.data_parallel.DataParallel` when every rank of a process
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
    top = max((int(ts.tokens.max()) for ts in token_sets.values() if getattr(ts, "tokens", None) is not None
               and ts.tokens.numel()), default=-1)
    if top >= vocab:
        raise ProbeError(f"checkpoint {label!r} has a vocabulary of {vocab} tokens but the sweep's token sets hold ids up to "
                         f"{top} (built with another checkpoint's tokenizer); sweep this checkpoint on its own data")


def _check_finite(row: ProbeRow) -> None:
    bad = [m["metric"] for m in row.metrics if m["value"] is None or not math.isfinite(m["value"])]
    if bad:
        raise ProbeError(f"{row.probe} {row.spec}: non-finite value for {bad}; the weights or data are broken")


# --------------------------------------------------------------------------- loaders (one per process)
_LOADERS: dict[Any, Any] = {}


def get_loader(trajectory, device=None, dtype=None, allow_pickle: bool = False):
    """A :class:`CheckpointLoader` for ``trajectory``, cached per process (one model instance reused)."""
    from probes.checkpoints import CheckpointLoader

    first = trajectory[0] if len(trajectory) else None
    key = (getattr(trajectory, "name", None), str(getattr(first, "location", None)), str(device), str(dtype), allow_pickle)
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


__all__ = ["probe_checkpoint", "CheckpointState", "PROBE_FUNCS", "ProbeError", "get_loader"]

"""Sharpness of one checkpoint (``losslens sharpness``): Hessian trace with its interval and λ_max.

Curvature of :func:`losslens.lm.core.next_token_loss.lm_loss` on the curvature token set
(docs/science.md §4): the default set of :func:`losslens.lm.data.default_token_sets` (held-out
embedded corpus, the checkpoint's tokenizer) or a saved :class:`TokenSet` file. Cost: ``num_matvecs``
HVPs for the trace plus the eigen solver's HVPs (≤ ``max_iter`` per eigenvalue).
"""

from __future__ import annotations

import time
from pathlib import Path

from dataclasses import dataclass
from typing import Optional

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.base.progress import ProgressArg, echo, progress_bar
from losslens.lm.shared_settings import (
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    LoadOptions,
    MemoryOptions,
    StateOptions,
    keywords,
    settings,
)

TRACE_METHODS = ("hutch++", "hutchinson")
"""Hessian trace estimators a caller may name (the sweep's plans, ``losslens sharpness``): Hutch++ and Hutchinson."""
EIGEN_METHODS = ("power", "lanczos")
"""Top-eigenvalue solvers a caller may name: power iteration and Lanczos."""

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}


class SharpnessError(LosslensError, ValueError):
    """Bad checkpoint path/label or options."""


@settings
@dataclass(frozen=True)
class SharpnessSettings:
    """What ``losslens sharpness`` measures: the trace estimate's HVP budget and method, the top-``k``
    eigenvalues' solver (``eigen_method``, ``max_iter``, ``tol``: converged means ``‖Hv − λv‖ ≤ tol·|λ|``),
    the parameter globs (None: all), the seed, and the curvature set (``data``: a saved TokenSet file;
    None: the default set, small with ``quick``). ``quiet``: no progress lines on stderr (default: the
    products done / planned with an ETA, :mod:`losslens.geometry.base.progress`)."""

    num_matvecs: int = 100
    method: str = "hutch++"
    k: int = 1
    params: Optional[list[str]] = None
    seed: int = 0
    quick: bool = False
    data: Optional[Path] = None
    max_iter: int = 100
    tol: float = 1e-3
    eigen_method: str = "lanczos"
    quiet: bool = False


def measure_sharpness(
    checkpoint: str | Path,
    settings: SharpnessSettings = SharpnessSettings(),
    *,
    source: CheckpointOptions = CheckpointOptions(),
    load: LoadOptions = LoadOptions(),
    memory: MemoryOptions = MemoryOptions(),
    compute: ComputeOptions = ComputeOptions(),
    errors: ErrorOptions = ErrorOptions(),
    state: StateOptions = StateOptions(),
) -> dict:
    """Trace (value, stderr, 95% CI, HVPs, seconds) and top-k eigenvalues of one checkpoint: what
    ``losslens sharpness --json`` prints (:func:`sharpness` takes the same options as keyword
    parameters). Every option is checked first, once, before anything is loaded
    (:class:`SharpnessError` naming the option); ``memory.strict_memory`` is applied to this process;
    ``errors.strict``: a flagged result (its products' measured error over ``errors.error_tolerance``)
    raises :class:`SharpnessError` instead of being returned. Cost: ``num_matvecs`` HVPs for the trace
    plus ≤ ``max_iter`` per eigenvalue. The options, by settings object:

    ``checkpoint``: a checkpoint folder or weight file (its step / tokens / LR are read from the
    trajectory folder around it), a trajectory folder (``source.label`` picks one; default the last real
    checkpoint), or a hub name ``hf:ORG/NAME@REV`` (``hf:ORG/NAME@step*`` with a label), opened by
    :func:`losslens.lm.checkpoints.open_checkpoint` with ``source``'s ``cache_dir`` (hub cache), ``schedule`` and
    ``tokens_per_step`` (:mod:`losslens.lm.checkpoints.schedule`: the LR / tokens reported). ``settings.data``: a saved
    TokenSet file for the curvature set (default: built). ``compute.threads``: torch threads for the
    estimators (None: torch's default). ``load.allow_pickle``: load torch files that need full pickle.
    ``memory.max_memory``: bytes or ``"8GB"`` each estimator may allocate beyond the model (default: a
    third of the total RAM, 80% of the GPU memory this process's tensors do not hold; never what
    happens to be free, so reruns choose the same settings: :mod:`losslens.geometry.memory.model`); what each chose
    (sketch size, block, basis, graph cache) is returned under ``memory``. ``load.dtype``: ``float32``
    (default), ``bfloat16``, ``float16`` or ``float64`` to load the weights in; products run in it,
    estimator algebra in float32 at least. ``compute.backend``: the HVP backend (``reverse``, ``forward``,
    ``difference`` or ``auto``, :class:`losslens.geometry.HessianOperator`); the result records it, the
    difference backend's measured error (``hvp_check``) and, for ``auto``, the choice and why
    (``backend_choice``). Bad options raise :class:`SharpnessError` before anything is loaded; a
    plan that cannot fit raises it before any product. ``compute.parallel="data"`` (under ``torchrun``):
    every rank loads the model, takes its contiguous share of the curvature batches and runs the
    same estimators; products are all-reduced (:mod:`losslens.geometry.operators.data_parallel`), so the numbers
    are one process's over all batches; every rank returns the same dict. ``parallel="fsdp"``:
    every rank holds 1/N of θ and of every vector (:mod:`losslens.geometry.operators.sharded`, gradient
    differences: an exact ``backend`` is replaced by the difference backend out loud, the reason in
    ``backend_choice``; its error is measured on a miniature of the architecture in the compute
    dtype against float64, :func:`losslens.lm.models.miniature.miniature_bound`). Tokens whose
    input-embedding row is zero (padding) are left out of the loss; ``excluded`` records which and
    how many positions and targets (:mod:`losslens.lm.models.zero_embeddings`).

    ``compute.compute_dtype``: the dtype the products run in (None: float32 for bfloat16/float16 weights,
    the weights' dtype otherwise; :mod:`losslens.geometry.operators.precision`); recorded as ``compute_dtype``,
    ``dtype`` is the weights'. ``errors.error_tolerance``: the products' measured relative error above which
    the result carries ``error_warning`` (the error, its likely cause and the fix; the CLI prints it
    and exits non-zero with ``--strict``); an error that could not be measured says why in
    ``hvp_check["reference"]``. Unless ``settings.quiet``, the products done / planned with an ETA on stderr
    (:func:`losslens.geometry.base.progress.progress_bar`; rank 0 only), after one stage line per step
    (curvature set, loading). ``state.basis_device``: where the estimators' solver state lives (None:
    the operator's device; ``"cpu"``, ``"disk"``: in the plans' ``host_parts``); ``state.master``: where
    the sharded operator's copy of θ lives (``"cpu"``); ``state`` is checked against
    ``compute.parallel`` first.
    """
    s, parallel, backend = settings, compute.parallel, compute.backend
    _check_settings(s, load, memory, compute, state)  # every option, once, before anything is loaded
    memory.apply()
    progress: ProgressArg = not s.quiet
    params = list(s.params) if s.params else None
    from losslens.geometry.operators.difference import DifferenceBackend
    from losslens.lm.checkpoints import CheckpointError, CheckpointLoader
    from losslens.lm.checkpoints.locate import open_checkpoint
    from losslens.lm.core.distributed import DistributedError, init_data_parallel

    try:
        traj, ref = open_checkpoint(
            checkpoint,
            source.label,
            cache_dir=source.cache_dir,
            schedule=source.schedule,
            tokens_per_step=source.tokens_per_step,
            alone=True,
        )
    except CheckpointError as exc:
        raise SharpnessError(str(exc)) from exc
    t0 = time.perf_counter()
    echo(progress, f"{ref.label}: building the curvature set", "sharpness")
    if s.data is not None:
        from losslens.lm.core.tokenset import TokenSet

        curv = TokenSet.load(s.data)
    else:
        from losslens.lm.data import default_token_sets

        curv = default_token_sets(traj, quick=s.quick, seed=s.seed)["curvature"]
    import torch

    dev = load.device or ("cuda" if torch.cuda.is_available() else None)
    batches, pg = list(curv), None
    if parallel in ("data", "fsdp"):
        from losslens.geometry.operators.data_parallel import DataParallel, split_batches

        try:
            rank, world, dev = init_data_parallel(device=load.device, mode=parallel)
            batches = split_batches(batches, rank, world)
        except (DistributedError, ValueError) as exc:
            raise SharpnessError(str(exc)) from exc
        pg = DataParallel()
    if pg is not None and pg.rank != 0:
        progress = False  # one display: rank 0's
    echo(progress, f"{ref.label}: loading the weights ({len(batches)} curvature batches)", "sharpness")
    try:
        model = CheckpointLoader(
            traj, device=dev, dtype=getattr(torch, load.dtype) if load.dtype else None, allow_pickle=load.allow_pickle
        ).load(ref)
    except CheckpointError as exc:
        raise SharpnessError(f"cannot load {ref.label!r}: {exc}") from exc
    model.requires_grad_(True)
    model.eval()
    from losslens.geometry.estimators.eigen import estimate_memory as eigen_memory
    from losslens.geometry.estimators.eigen import top_eigenvalues
    from losslens.geometry.memory.budget import MemoryBudgetError
    from losslens.geometry.operators.interface import OperatorError
    from losslens.geometry.estimators.trace import estimate_memory as trace_memory
    from losslens.geometry.estimators.trace import hutchinson_trace, hutchpp_trace
    from losslens.lm.core.threads import torch_threads
    from losslens.lm.models.curvature import error_warning, lm_operator
    from losslens.lm.models.lm_setup import plan_lm_setup
    from losslens.lm.models.sharding import fsdp_lm_hessian

    echo(progress, f"{ref.label}: preparing the Hessian operator (backend {backend})", "sharpness")
    fsdp = parallel == "fsdp"  # every rank holds 1/N of θ, of every vector and of the estimators' state
    try:
        setup = plan_lm_setup(  # decided once: compute dtype, excluded tokens, losses, the set-up's memory
            model,
            batches,
            params=params,
            backend=DifferenceBackend.name if fsdp else backend,
            lean_head=not fsdp,
            max_memory=None if fsdp else memory.max_memory,  # the sharded operator plans its own shards
            compute_dtype=compute.compute_dtype,
            data_parallel=pg,
            bound=fsdp,  # no exact product runs on the shards: the error is bounded on a miniature
        )
        if fsdp:
            op = fsdp_lm_hessian(setup, dev, backend, max_memory=memory.max_memory, master_device=state.master)
        else:  # over error_tolerance the operator warns (ProductErrorWarning), once
            op = lm_operator(
                setup,
                errors.error_tolerance,
                max_memory=memory.max_memory,
                **({"data_parallel": pg} if pg is not None else {}),
            )
        # both plans are checked before any product: a plan that cannot fit fails here, in one line
        place = {"basis_device": state.basis_device} if state.basis_device is not None else {}  # solver state
        trace_memory(op, s.method, s.num_matvecs, **place)
        eigen_memory(op, s.k, s.eigen_method, s.max_iter, **place)
        with torch_threads(compute.threads):
            with progress_bar(
                progress, s.num_matvecs, what=f"trace ({s.method})", unit="HVP", label="sharpness"
            ) as bar:
                op.on_products = bar.update
                if s.method == "hutch++":
                    est = hutchpp_trace(op, num_matvecs=s.num_matvecs, seed=s.seed, **place)
                else:  # no solver state: nothing to place
                    est = hutchinson_trace(op, num_matvecs=s.num_matvecs, seed=s.seed)
            most = (
                s.max_iter if s.eigen_method == "lanczos" else s.k * s.max_iter
            ) + s.k  # + the final block of k products (the true residuals)
            what = f"top-{s.k} eigenvalues, {s.eigen_method} (at most)"
            with progress_bar(progress, most, what=what, unit="HVP", label="sharpness") as bar:
                op.on_products = bar.update
                ev = top_eigenvalues(
                    op, k=s.k, method=s.eigen_method, tol=s.tol, max_iter=s.max_iter, seed=s.seed, **place
                )
            op.on_products = None
    except (MemoryBudgetError, OperatorError) as exc:
        raise SharpnessError(str(exc)) from exc
    res = {
        "checkpoint": ref.label,
        "step": ref.step,
        "tokens": ref.tokens,
        "lr": ref.lr,
        "location": ref.location,
        "dim": getattr(op, "global_dim", op.dim),
        "params": params,
        "data": {"shape": list(curv.tokens.shape), "content_hash": curv.content_hash},
        "dtype": load.dtype or str(getattr(op, "storage_dtype", op.param_dtype)).replace("torch.", ""),
        "compute_dtype": str(op.param_dtype).replace("torch.", ""),
        "trace": {
            "value": est.value,
            "stderr": est.stderr,
            "ci_low": est.ci_low,
            "ci_high": est.ci_high,
            "method": est.method,
            "num_matvecs": est.num_matvecs,
            "seconds": est.seconds,
            "seed": s.seed,
            "memory": est.memory,
        },
        "eigen": {
            "values": list(ev.values),
            "residuals": list(ev.residuals),
            "converged": list(ev.converged),
            "method": ev.method,
            "num_matvecs": ev.num_matvecs,
            "iterations": ev.iterations,
            "seconds": ev.seconds,
            "memory": ev.memory,
        },
        "seconds": time.perf_counter() - t0,
        "device": str(op.device),
        "parallel": {
            "mode": parallel,
            "world_size": pg.world_size if pg else 1,
            "backend": pg.backend if pg else None,
            "batches_per_rank": pg.gather_objects(len(batches)) if pg else [len(batches)],
            **(
                {"elements_per_rank": pg.gather_objects(op.local_dim), "master_device": state.master or "device"}
                if parallel == "fsdp"
                else {}
            ),
        },
        "backend": op.backend,
        "hvp_check": op.checked(),
        "backend_choice": op.backend_choice,
        "excluded": getattr(
            op, "excluded", None
        ),  # zero-embedding tokens left out (losslens.lm.models.zero_embeddings)
        "error_warning": error_warning(op.checked(), op.param_dtype, errors.error_tolerance),
    }
    if errors.strict and res["error_warning"]:
        raise SharpnessError(f"{res['error_warning']['message']} (strict: the result is not returned)")
    return res


def _check_settings(
    s: SharpnessSettings, load: LoadOptions, memory: MemoryOptions, compute: ComputeOptions, state: StateOptions
) -> None:
    """Refuse bad options up front (before data and weights are loaded), naming the option and the
    valid range: :class:`SharpnessError` (``state``'s own check raises its ``SettingsError``)."""
    from losslens.geometry.operators.auto import AutoBackend
    from losslens.geometry.operators.difference import DifferenceBackend
    from losslens.geometry.operators.names import BACKENDS, backend_named
    from losslens.geometry.operators.precision import COMPUTE_DTYPES
    from losslens.geometry.operators.reverse import ReverseBackend
    from losslens.lm.core.distributed import PARALLEL_MODES

    state.check(compute.parallel)  # a SettingsError naming the option, as memory.apply()'s
    if s.method not in TRACE_METHODS:
        raise SharpnessError(f"trace method {s.method!r} is unknown; valid: {', '.join(TRACE_METHODS)}")
    if s.eigen_method not in EIGEN_METHODS:
        raise SharpnessError(f"eigen method {s.eigen_method!r} is unknown; valid: {', '.join(EIGEN_METHODS)}")
    least = 3 if s.method == "hutch++" else 1
    if not isinstance(s.num_matvecs, int) or isinstance(s.num_matvecs, bool) or s.num_matvecs < least:
        raise SharpnessError(
            f"num_matvecs (--num-matvecs) must be an integer >= {least} for {s.method} (its HVP budget"
            f"{'; Hutch++ splits it in three parts' if s.method == 'hutch++' else ''}), got {s.num_matvecs!r}"
        )
    for name, v in (("k (--k)", s.k), ("max_iter", s.max_iter)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SharpnessError(f"{name} must be an integer >= 1, got {v!r}")
    if not (isinstance(s.tol, (int, float)) and s.tol > 0):
        raise SharpnessError(f"tol must be a positive number, got {s.tol!r}")
    parallel, backend = compute.parallel, compute.backend
    if parallel not in PARALLEL_MODES:
        raise SharpnessError(f"--parallel {parallel!r} is unknown; valid: {', '.join(PARALLEL_MODES)}")
    if backend not in BACKENDS:
        raise SharpnessError(f"--backend {backend!r} is unknown; valid: {', '.join(BACKENDS)}")
    if parallel != "none" and isinstance(backend_named(backend), AutoBackend):
        raise SharpnessError(
            f"--backend {backend} is not available with --parallel {parallel}: pass --backend "
            f"{ReverseBackend.name} or {DifferenceBackend.name}"
        )
    if parallel == "fsdp" and s.params:
        raise SharpnessError(
            "--params is not supported with --parallel fsdp yet: sharded curvature is w.r.t. "
            "every parameter (or use --parallel data with a selection)"
        )
    if compute.compute_dtype is not None and compute.compute_dtype not in COMPUTE_DTYPES:
        raise SharpnessError(
            f"--compute-dtype {compute.compute_dtype!r} is unknown; valid: {', '.join(COMPUTE_DTYPES)}"
        )
    if load.dtype is not None and load.dtype not in _DTYPES:
        raise SharpnessError(f"--dtype {load.dtype!r} is unknown; valid: {', '.join(_DTYPES)}")
    if memory.max_memory is not None:
        from losslens.geometry.memory.budget import MemoryBudgetError, parse_bytes

        try:
            parse_bytes(memory.max_memory, load.device)
        except MemoryBudgetError as exc:
            raise SharpnessError(f"--max-memory: {exc}") from exc


sharpness = keywords(
    measure_sharpness,
    "sharpness",
    """``sharpness(checkpoint, *, num_matvecs=100, ..., max_memory=None, ...)``: :func:`measure_sharpness`
with every option a keyword parameter named like the CLI's (``--max-memory`` -> ``max_memory``) and
its default; a whole settings object may be passed by its name (``memory=MemoryOptions(...)``).
``checkpoint``: a path or an ``hf:`` name (see :func:`measure_sharpness`). Returns what
``losslens sharpness --json`` prints.""",
)

__all__ = ["EIGEN_METHODS", "TRACE_METHODS", "SharpnessError", "SharpnessSettings", "measure_sharpness", "sharpness"]

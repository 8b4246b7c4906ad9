"""The curvature operator of a language model's loss, with its second-order capability checked.

:func:`lm_hessian` is what every LM-level curvature probe uses (sweeps, ``losslens sharpness``):
a :class:`losslens.geometry.HessianOperator` of :func:`losslens.lm.core.next_token_loss.lm_loss`, built only after
:func:`losslens.lm.models.second_order.ensure_second_order` has checked — once per architecture, on a
2×16-token slice carrying every special token (on a float64 miniature of the architecture for
models over 50M parameters or in half precision) — that the chosen backend's products agree with
finite differences of the gradient and of the loss. An architecture whose ops lack a forward-AD rule falls back to the
reverse backend with a :class:`~losslens.lm.models.second_order.SecondOrderWarning` naming the op; one whose products
cannot
be trusted raises :class:`~losslens.lm.models.second_order.SecondOrderError` (recorded as a failed row
by sweeps) — never a silently wrong number.

:func:`losslens.lm.models.lm_setup.plan_lm_setup` settles, before anything is measured, what the operator
is built from (the compute dtype, the zero-embedding tokens left out of its loss, the loss with and
without the lean head, the miniature) and refuses
(:class:`~losslens.geometry.memory.budget.MemoryBudgetError`, one line) when a measuring step of the
set-up cannot fit ``max_memory``, in the order of their cost (that module's docstring); then the
check runs once and the one operator is built from the plan.

With ``max_memory=None`` nothing is refused and the check chooses as before (an estimator may be
given its own budget later). An accepted run measures and computes what it did before.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from losslens.geometry.memory.budget import MemoryBudgetError
from losslens.geometry.operators.auto import AutoBackend
from losslens.geometry.operators.names import DEFAULT_BACKEND, backend_class, backend_named
from losslens.geometry.operators.data_parallel import DataParallel
from losslens.geometry.operators.difference import DifferenceBackend
from losslens.geometry.operators.guarantees import warn_product_error
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.reverse import ReverseBackend

from losslens.lm.models.lm_setup import UNCHECKED, LmSetup, plan_lm_setup
from losslens.lm.models.second_order import SecondOrderError, ensure_second_order

__all__ = ["lm_hessian", "lm_operator", "error_warning", "ERROR_TOLERANCE"]
#: Measured relative product error above which a result is flagged (:func:`error_warning`, the CLI's
#: ``--error-tolerance`` default) and :func:`lm_hessian`'s operator warns (``ProductErrorWarning``).
ERROR_TOLERANCE = 1e-2


def lm_hessian(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    params=None,
    backend: Any = DEFAULT_BACKEND,
    check: bool = True,
    lean_head: bool = True,
    error_tolerance: float = ERROR_TOLERANCE,
    **kwargs,
) -> HessianOperator:
    """Hessian of the mean LM loss over ``batches`` ([b, s] token tensors) w.r.t. ``params`` globs.

    ``check``: run the cached second-order check first (cost, once per architecture: a float64
    copy of models under 50M parameters, else a float64 miniature, plus a few HVPs, gradients and
    forwards on 2×16 tokens). With ``max_memory`` every measuring step of the set-up (the check,
    the graph of a batch) is planned first and refused before it runs when it cannot fit
    (:func:`losslens.lm.models.lm_setup.plan_lm_setup`). ``lean_head``: with the reverse backend, take the loss through
    the closed-form chunked LM head (:func:`losslens.lm.core.lm_head.lm_loss_lean`: the same loss, no
    ``[tokens, vocab]`` tensor in the double-backward graph; models whose logits are not a plain
    linear head fall back to :func:`~losslens.lm.core.next_token_loss.lm_loss` by themselves). ``backend``:
    a name or a configured backend object (:class:`HessianOperator`'s ``backend``). Extra keyword
    arguments go to :class:`HessianOperator` (``max_memory``, ``chunk_size``, ``data_parallel``, ...);
    with a :class:`~losslens.geometry.operators.data_parallel.DataParallel` as ``data_parallel`` the check is agreed
    over the ranks (a failure on one rank is raised on all).

    ``backend="difference"`` (gradient differences, :mod:`losslens.geometry.operators.difference`) needs no
    second-order rule: the second-order check is skipped and the operator measures its own error
    against the exact reverse products on ``batches[0][:2, :32]`` (:meth:`HessianOperator.checked`).
    ``backend="auto"``: the reverse backend when its pass fits ``max_memory``, else the difference
    backend when its measured error is within its ``tolerance``. With either, a float64
    model's loss runs under :func:`~losslens.lm.models.fidelity.float64_fidelity` (HF's float32 norms and
    softmax in float64), so the float64 step measures the method, not float32 rounding.

    Tokens whose input-embedding row is zero (padding) are left out of the loss as inputs and
    targets, with every backend (:mod:`losslens.lm.models.zero_embeddings`: the first normalisation is
    singular there); ``op.excluded`` records which and how many (summed over the ranks).

    This is the Python path that gets what ``losslens sharpness`` gets: the exclusion above, float64
    fidelity for gradient differences, and an inexact backend's error measured before the operator is
    returned, a :class:`~losslens.geometry.base.errors.ProductErrorWarning` (once) when it exceeds
    ``error_tolerance`` (``op.error_tolerance``; the CLI's ``--error-tolerance`` default,
    :data:`ERROR_TOLERANCE`), whether measured on the check slice or bounded on a miniature.
    """
    setup = plan_lm_setup(
        model,
        batches,
        params,
        backend,
        check,
        lean_head,
        max_memory=kwargs.get("max_memory"),
        compute_dtype=kwargs.get("compute_dtype"),
        loss_transient_bytes=kwargs.get("loss_transient_bytes"),
        data_parallel=kwargs.get("data_parallel"),
    )  # every measuring step of the set-up is planned first, and refused before it runs when it cannot fit
    return lm_operator(setup, error_tolerance, **kwargs)


def lm_operator(setup: LmSetup, error_tolerance: float = ERROR_TOLERANCE, **kwargs) -> HessianOperator:
    """The one operator of a planned set-up (:func:`losslens.lm.models.lm_setup.plan_lm_setup`): the
    second-order check (when the set-up runs one; it may change the backend, out loud), then the
    operator of the set-up's loss in its compute dtype, its excluded tokens recorded, and an inexact
    backend's error measured (or bounded on the set-up's miniature) and warned about over
    ``error_tolerance``. ``kwargs``: :class:`HessianOperator`'s (``max_memory``, ``chunk_size``,
    ``data_parallel``, ...). What :func:`lm_hessian` returns."""
    model, batches, chosen = setup.model, setup.batches, setup.backend
    auto = isinstance(chosen, AutoBackend)
    kwargs["compute_dtype"] = setup.compute_dtype  # decided once
    if setup.runs_check:
        checked = _second_order_check(setup, kwargs.get("data_parallel"))
        if not auto or not backend_class(checked).second_order:  # the check chose: keep the settings of its choice
            chosen = chosen if checked == chosen.name else chosen.difference if auto else backend_named(checked)
            auto = False
    lean = setup.lean_head and chosen.lean_head  # the lean head's derivatives are reverse-mode only
    if lean:
        kwargs.setdefault("loss_transient_bytes", setup.head_bytes)
    # zero-embedding tokens left out; a float64 model's float32 islands would swamp a float64-sized step
    loss_fn = setup.difference_loss if auto or not chosen.exact else setup.lean_loss if lean else setup.exact_loss
    op = HessianOperator(model, loss_fn, batches, params=setup.params, backend=chosen, **kwargs)
    if setup.precision == UNCHECKED and op.product_backend.second_order:
        why = op.backend_choice["why"]
        raise MemoryBudgetError(
            f"backend={AutoBackend.name!r} chose the exact pass ({why}), but its second-order check does not "
            f"fit max_memory; raise max_memory or pass backend={DifferenceBackend.name!r}"
        )
    op.excluded = setup.excluded
    op.error_tolerance = float(error_tolerance)  # before the check below: it warns over this tolerance
    if not op.product_backend.exact and batches and op.checked()["rel_error"] is None:
        op.hvp_check = {**op.hvp_check, **setup.bounded_error(op.check_batches or [batches[0][:2, :32]])}
        warn_product_error(op)  # the bound, over the tolerance: said once, as a measured error is
    return op


def _second_order_check(setup: LmSetup, parallel: Any) -> str:
    """The backend the second-order check trusts for the set-up's backend on a 2×16 slice of its first
    batch, checked at the set-up's precision (on its miniature when it uses one); an ``auto`` backend
    whose exact pass no check can trust gets the difference backend. With a :class:`DataParallel` a
    check failing on one rank fails on every rank (never hangs)."""
    chosen, probe = setup.backend, setup.batches[0][:2, :16]
    auto = isinstance(chosen, AutoBackend)
    exact = chosen.reverse if auto else chosen

    def second_order() -> str:
        if setup.precision == UNCHECKED:  # backend="auto", the check cannot fit: the exact backend is refused later
            return exact.name
        try:
            return ensure_second_order(
                setup.model,
                probe,
                backend=exact.name,
                params=setup.params,
                loss_fn=setup.exact_loss,
                precision=setup.precision,
                build=setup.miniature,
            )
        except SecondOrderError:
            if not auto:
                raise
            return chosen.difference.name  # no exact backend is trustworthy: only the first-order one can run

    if isinstance(parallel, DataParallel):
        return parallel.agree(second_order, "the second-order check", probe.device)
    return second_order()


def error_warning(check: dict | None, compute_dtype, tolerance: float = ERROR_TOLERANCE) -> dict | None:
    """The warning a result carries when its products' measured relative error exceeds ``tolerance``:
    ``{"rel_error", "tolerance", "cause", "fix", "message"}`` (one line); None when the error is within
    it, or not measured (``check["reference"]`` then says why) or the backend is exact (``check`` None)."""
    err = None if check is None else check.get("rel_error")
    if err is None or err <= tolerance:
        return None
    half = compute_dtype in (torch.bfloat16, torch.float16)
    name = str(compute_dtype).replace("torch.", "")
    kinked = check.get("non_smooth_activations") or []
    if half:
        cause, fix = (
            f"half-precision compute ({name})",
            "--compute-dtype float32 (the default for half-precision weights)",
        )
    elif kinked:
        cause = f"activations that are not smooth ({', '.join(kinked)}): gradient differences straddle their kinks"
        fix = f"--backend {ReverseBackend.name} (exact) where its pass fits"
    else:
        cause = f"the gradient-difference step in {name} (possibly a token whose input-embedding row is zero)"
        fix = f"--backend {ReverseBackend.name} where its pass fits, or curvature data without zero-embedding tokens"
    return {
        "rel_error": err,
        "tolerance": tolerance,
        "cause": cause,
        "fix": fix,
        "message": f"the Hessian products' measured relative error is {err:.2g} (> {tolerance:g}): cause: {cause}; "
        f"fix: {fix}",
    }

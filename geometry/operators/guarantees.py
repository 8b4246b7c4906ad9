"""What a curvature operator says out loud before its numbers leave (issue #45).

Two caveats the command line reports are Python warnings (:class:`~losslens.geometry.base.errors.LosslensWarning`
subclasses) at the operator level too, whatever loss and however the operator was built:

- :func:`warn_product_error`: the products' measured relative error (``op.hvp_check["rel_error"]``, the
  difference backend's check against exact products, :mod:`losslens.geometry.operators.product_check`)
  exceeds ``op.error_tolerance``: a :class:`~losslens.geometry.base.errors.ProductErrorWarning`, once per
  operator, with the error, the tolerance, the backend and what to do;
- :func:`zero_embedding_tokens_in`: the batches hold tokens whose input-embedding row is all zero (a
  padding row, never trained) and the loss does not leave them out (a loss leaves tokens out by carrying
  their ids as ``exclude``, itself or through the ``loss_fn`` it wraps): a
  :class:`~losslens.geometry.base.errors.ZeroEmbeddingWarning` naming the ids. Checked only where it is
  cheap and certain: a model with a 2-D input embedding (``model.get_input_embeddings()``, not sharded)
  and integer token batches (tensors, or dicts with ``input_ids``).

:func:`before_products` runs both before an operator's first product (an inexact backend's error is
measured then if no estimator measured it first), so no product of an operator leaves unmeasured; an
operator whose error its caller measures itself (the error check's own operators) sets
``verify_products = False``. Warnings point at the first frame outside losslens (:func:`warn`).
Cost: one pass over the batches' token ids (``torch.unique``) and a gather of their embedding rows,
once per operator; the product check's cost is :func:`~losslens.geometry.operators.product_check.measure`'s.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Sequence

import torch

from losslens.geometry.base.errors import ProductErrorWarning, ZeroEmbeddingWarning

__all__ = ["before_products", "warn_product_error", "product_error_message", "zero_embedding_tokens_in", "warn"]

_GEOMETRY = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _ours(filename: str) -> bool:
    roots = [_GEOMETRY]
    package = sys.modules.get("losslens")
    if getattr(package, "__file__", None):
        roots.append(os.path.dirname(os.path.abspath(package.__file__)) + os.sep)
    path = os.path.abspath(filename)
    return any(path.startswith(r) for r in roots)


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the first caller outside losslens (the user's line)."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and _ours(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def product_error_message(op: Any, check: dict, tolerance: float) -> str:
    """The one-paragraph message of a :class:`ProductErrorWarning`: the error, the tolerance, the
    backend and its step, where it was measured, and what to do."""
    err = check["rel_error"]
    dtype = getattr(op, "param_dtype", None)
    kinked = check.get("non_smooth_activations") or []
    step = check.get("step")
    how = f"backend={check.get('backend', getattr(op, 'backend', '?'))!r}" + (
        f" (step h={step:.2g}{', Richardson' if check.get('richardson') else ''})" if step else ""
    )
    if dtype in (torch.bfloat16, torch.float16):
        fix = "compute_dtype='float32' (the default for half-precision weights), or backend='reverse' where it fits"
    elif kinked:
        fix = f"backend='reverse' (exact) where its pass fits: activations {', '.join(kinked)} are not smooth"
    else:
        fix = (
            "backend='reverse' (exact) where its pass fits, or backend=DifferenceBackend(step=..., richardson=True); "
            "for a language model build the operator with losslens.lm.models.lm_hessian (it leaves zero-embedding "
            "tokens out and runs a float64 model's float32 islands in float64)"
        )
    return (
        f"the Hessian-vector products' measured relative error is {err:.3g}, above error_tolerance={tolerance:g} "
        f"({how}; measured against {check.get('reference', 'exact products')}): every number computed from these "
        f"products carries it. Fix: {fix}"
    )


def warn_product_error(op: Any) -> None:
    """A :class:`ProductErrorWarning` when ``op.hvp_check["rel_error"]`` exceeds ``op.error_tolerance``
    (default: the difference backend's ``DEFAULT_TOLERANCE``); at most once per operator. An error
    that could not be measured (None, its reason in ``hvp_check["reference"]``) does not warn."""
    from losslens.geometry.operators.difference import DEFAULT_TOLERANCE

    check = getattr(op, "hvp_check", None)
    err = check.get("rel_error") if isinstance(check, dict) else None
    tolerance = float(getattr(op, "error_tolerance", DEFAULT_TOLERANCE))
    if err is None or not (err > tolerance or err != err) or getattr(op, "product_error_warned", False):
        return
    op.product_error_warned = True  # before warning: under simplefilter("error") the raise is the one report
    warn(product_error_message(op, check, tolerance), ProductErrorWarning)


def _input_embedding(model: Any) -> torch.Tensor | None:
    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        return None
    weight = getattr(emb, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.is_meta or hasattr(weight, "device_mesh"):
        return None  # no embedding matrix, or a sharded one (reading it is a collective)
    return weight


def _token_ids(batch: Any) -> torch.Tensor | None:
    ids = batch.get("input_ids") if isinstance(batch, dict) else batch
    if (
        isinstance(ids, torch.Tensor)
        and not ids.is_floating_point()
        and not ids.is_complex()
        and ids.dtype != torch.bool
    ):
        return ids
    return None


def _excluded_by(loss_fn: Any) -> set[int]:
    """Token ids ``loss_fn`` leaves out: its ``exclude`` and those of the losses it wraps (``.loss_fn``)."""
    out: set[int] = set()
    for _ in range(8):  # wrappers nest a few deep (fidelity → excluding → loss)
        if loss_fn is None:
            break
        out |= {int(i) for i in getattr(loss_fn, "exclude", ()) or ()}
        loss_fn = getattr(loss_fn, "loss_fn", None)
    return out


def zero_embedding_tokens_in(model: Any, loss_fn: Any, batches: Sequence[Any]) -> tuple[int, ...]:
    """Sorted ids present in ``batches`` whose row of ``model``'s input embedding is all zero and that
    ``loss_fn`` does not leave out; ``()`` where the check does not apply (module docstring)."""
    weight = _input_embedding(model)
    ids = [t for t in map(_token_ids, batches) if t is not None] if weight is not None else []
    if not ids:
        return ()
    present = torch.unique(torch.cat([t.reshape(-1).to(weight.device) for t in ids]))
    present = present[(present >= 0) & (present < weight.shape[0])]
    with torch.no_grad():
        zero = (weight.detach()[present] == 0).all(dim=1)
    return tuple(sorted(set(present[zero].tolist()) - _excluded_by(loss_fn)))


def before_products(op: Any) -> None:
    """Run before each batch of products (cheap after the first): the zero-embedding check (once) and,
    for an inexact backend, ``op.checked()`` (measured once; it warns when over the tolerance). Nothing
    when ``op.verify_products`` is False."""
    if not getattr(op, "verify_products", True):
        return
    if getattr(op, "zero_embedding_check", None) is None:
        op.zero_embedding_check = found = zero_embedding_tokens_in(op.model, op.loss_fn, op.batches)
        if found:
            warn(
                f"the batches hold token id(s) {list(found)[:8]} whose input-embedding row is all zero (padding, "
                "never trained) and the loss counts them: the curvature there is an artefact of the untrained row "
                "(the first normalisation is singular at a zero input) and gradient differences are wrong there. "
                "Build a language model's operator with losslens.lm.models.lm_hessian (it leaves them out), or pass "
                "a loss that does (losslens.lm.core.next_token_loss.ExcludingLoss(lm_loss, ids)); filter "
                "ZeroEmbeddingWarning to keep them on purpose",
                ZeroEmbeddingWarning,
            )
    if not op.product_backend.exact:
        op.checked()

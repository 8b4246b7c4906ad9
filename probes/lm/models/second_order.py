"""The second-order AD check: can curvature be trusted on this model?

Curvature needs double backward (``"reverse"`` HVP backend) or forward-mode AD over reverse
(``"forward"``). Most ops have both rules, but a model may contain ops that lack one or — worse —
custom ``autograd.Function`` s whose backward is not itself differentiable, which makes double
backward return a *silently wrong* Hessian. :func:`check_second_order` probes a model on one tiny
batch: it computes a few HVPs with both backends and compares them with a central finite
difference of gradients (an AD-rule-free reference), records the error messages (which name the
op), lists custom autograd Functions found in the loss graph with the modules that produced them,
and recommends a backend. :func:`ensure_second_order` wraps it for sweeps and the CLI: it runs the
check once per architecture (cached), warns with a message naming the op when it falls back to
the other backend, and raises :class:`SecondOrderError` when no backend is trustworthy — never a
silent wrong number.

Attention: PyTorch's fused SDPA kernels have neither rule; :class:`losslens.geometry.operators.hessian.HessianOperator`
runs every forward under the SDPA MATH backend. Attention implementations outside ``eager`` and
``sdpa`` (flash-attention, flex-attention, hub kernels) are not covered by that context;
:func:`curvature_safe` switches such a model to ``sdpa`` (MATH under the operator) for the
duration of a block and says so.

Measured on the six tiny families (float64, transformers 5.23, torch 2.13 CPU): every family has
both rules for every op, reverse and forward agree to ~1e-7 relative (HF's norms and eager softmax
compute in float32 even in a float64 model, which bounds the agreement), and both match the
finite difference; Apertus' xIELU runs its pure-PyTorch path on CPU (``torch.where``/``expm1``,
twice differentiable, forward-AD capable). Its CUDA kernel (``xielu`` wheel) is a ``torch.classes``
op without autograd: :func:`curvature_safe` switches it to the Python path during curvature, with a
warning. No family needs a backend fallback on CPU; the fallbacks are exercised by tests with
custom ``autograd.Function`` activations (no forward-AD rule → reverse backend with a warning; a
non-differentiable backward → :class:`SecondOrderError`).

Hooking into sweeps / the CLI: before building a :class:`~losslens.geometry.operators.hessian.HessianOperator` for a
checkpoint, call ``backend = ensure_second_order(model, first_curvature_batch[:2, :16], backend=
requested)``, build the operator with that backend and run its products inside ``with
curvature_safe(model):`` (a no-op for eager/sdpa models); the check is
cached per architecture, so a trajectory pays for it once.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from typing import Callable, Iterator

import torch
from torch import nn

from losslens.geometry.base.errors import LosslensError
from losslens.geometry.operators.forward import ForwardBackend
from losslens.geometry.operators.hessian import HessianOperator
from losslens.geometry.operators.names import DEFAULT_BACKEND, SECOND_ORDER_BACKENDS
from losslens.geometry.operators.reverse import ReverseBackend
from losslens.lm.core.next_token_loss import lm_loss
from losslens.lm.core.numerics import rel_error

from losslens.lm.models.families import family_of
from losslens.lm.models.fd_references import fd_hvp, fd_quadratic, probe_vectors, with_special_tokens
from losslens.lm.models.miniature import fill_zero_embedding_rows, working_model
from losslens.lm.models.op_diagnostics import custom_functions, format_exc, ops_in, worst_params
from losslens.lm.models.second_order_report import BackendCheck, SecondOrderReport

__all__ = [
    "check_second_order",
    "SecondOrderError",
    "SecondOrderWarning",
    "ensure_second_order",
    "curvature_safe",
    "architecture_key",
]


class SecondOrderError(LosslensError, RuntimeError):
    """No HVP backend gives a trustworthy Hessian for this model (message names the op)."""


class SecondOrderWarning(UserWarning):
    """A curvature backend was replaced by the other one, or attention/activations were switched."""


def check_second_order(
    model: nn.Module,
    batch,
    loss_fn: Callable | None = None,
    params=None,
    num_vectors: int = 2,
    seed: int = 0,
    precision: str | torch.dtype = "auto",
    rtol: float | None = None,
    eps: float | None = None,
    preferred: str = DEFAULT_BACKEND,
    build=None,
) -> SecondOrderReport:
    """Probe whether both HVP backends give the true Hessian of ``model`` on one tiny batch.

    For ``num_vectors`` seeded unit vectors v (:func:`~losslens.lm.models.fd_references.probe_vectors`:
    the second one on the embedding rows of the batch's tokens) it computes H v with the
    ``"reverse"`` and ``"forward"`` backends of :class:`losslens.geometry.operators.hessian.HessianOperator` and two
    references that need no second-order rule: the central difference of gradients
    (g(θ+εv) − g(θ−εv))/2ε, and the second difference of the loss, which estimates vᵀHv from
    forward passes only and so also catches a first-order backward that is not the derivative of
    its forward. A backend is *ok* when it runs, its relative error against the gradient
    difference is ≤ ``rtol`` and its vᵀHv matches the loss's second difference to ``rtol`` · ‖Hv‖.
    An exception (missing forward-AD rule, missing/``once_differentiable`` double backward) is
    recorded with the op names its message gives. Custom ``autograd.Function`` s in the loss graph
    are listed with the module that produced them. An LM batch gets every special token of the
    model written into its first row (:func:`~losslens.lm.models.fd_references.with_special_tokens`),
    where token-dependent gradient masking (``padding_idx``) hides.

    Args:
        model: the model (not modified: weights are restored bit-exactly after the FD steps).
        batch: one small batch (e.g. a [2, 16] LongTensor) or a list of batches.
        loss_fn: ``loss_fn(model, batch)``; default :func:`losslens.lm.core.next_token_loss.lm_loss`.
        params: parameter globs (default all; ignored on a miniature, which checks every parameter).
        num_vectors: probe vectors (each costs 2 HVPs, 4 gradients and 4 forwards).
        seed: seed of the probe vectors.
        precision: ``"auto"``: a float64 copy of models under 50M parameters; for larger or
            half-precision models a float64 miniature of the same architecture
            (:func:`losslens.lm.models.miniature.miniature`; AD rules do not depend on width or depth),
            or, when none can be built, the model itself in float32 at least. Or a dtype,
            ``"native"`` (the model as it is) or ``"miniature"`` (as ``"auto"`` for a large model,
            whatever the model's size: no copy of it).
        rtol: tolerance against the references; default 2e-3 (float64), 1e-2 (float32), 5e-2 (half);
            raised to 10× the references' own noise (their change between steps ε and ε/2) when that
            is larger (reported in ``messages``).
        eps: gradient-difference step along unit vectors; default 1e-2 (float64) / 3e-2 (float32) /
            0.1 (half). The loss second difference uses 10ε (its noise grows like 1/ε²).
        preferred: backend to recommend when both are ok.
        build: what makes the float64 miniature when one is used (a set-up's, built once:
            :meth:`losslens.lm.models.lm_setup.LmSetup.miniature`; default a new one).

    Returns :class:`~losslens.lm.models.second_order_report.SecondOrderReport`. Cost: 2·num_vectors HVPs,
    8·num_vectors gradients and 4·num_vectors + 2 forwards on the batch, plus the copy or miniature.
    """
    t0 = time.perf_counter()
    loss_fn = loss_fn or lm_loss
    batches = [batch] if isinstance(batch, torch.Tensor) else list(batch)
    messages: list[str] = []
    work, checked_on = working_model(model, precision, messages, build)
    if checked_on == "float64 miniature":
        params = None
    if work is not model:
        fill_zero_embedding_rows(work)
    batches = [with_special_tokens(work, b) for b in batches]
    dtype = next(work.parameters()).dtype
    wide = dtype == torch.float64
    if eps is None:
        eps = 1e-2 if wide else (3e-2 if dtype == torch.float32 else 1e-1)
    base_rtol = rtol if rtol is not None else (2e-3 if wide else 1e-2 if dtype == torch.float32 else 5e-2)
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in (None, "eager", "sdpa"):
        messages.append(
            f"attention implementation {attention!r} is not covered by the SDPA-MATH context of the "
            "HVP operators; wrap curvature in losslens.lm.models.second_order.curvature_safe(model) (switches to sdpa)"
        )
    with curvature_safe(work, quiet=True):
        customs = custom_functions(work, loss_fn, batches[0])
        ops = {b: HessianOperator(work, loss_fn, batches, params=params, backend=b) for b in SECOND_ORDER_BACKENDS}
        op_rev = ops[ReverseBackend.name]
        V = probe_vectors(op_rev, num_vectors, seed, dtype)
        ref, ref_half = fd_hvp(op_rev, V, eps), fd_hvp(op_rev, V, eps / 2)
        quad, quad_half = fd_quadratic(op_rev, V, 10 * eps), fd_quadratic(op_rev, V, 5 * eps)
        fd_noise = rel_error(ref, ref_half)
        tol = max(base_rtol, 10 * fd_noise)
        if tol > base_rtol:
            messages.append(
                f"the finite-difference reference is only accurate to {fd_noise:.1e} (relative) in {dtype}; "
                f"tolerance raised to {tol:.1e}"
            )
        checks: dict[str, BackendCheck] = {}
        products: dict[str, torch.Tensor] = {}
        for backend in SECOND_ORDER_BACKENDS:
            op = ops[backend]
            try:
                HV = op.matmat_flat(V)
            except Exception as e:  # noqa: BLE001 - every failure is reported, none is swallowed silently
                checks[backend] = BackendCheck(backend, False, error=format_exc(e), ops=ops_in(str(e)))
                continue
            products[backend] = HV
            err = rel_error(HV, ref)
            q = (V.double() * HV.double()).sum(1).cpu()
            scale = torch.linalg.vector_norm(HV.double(), dim=1).cpu().clamp_min(1e-30)
            q_noise = float(((quad - quad_half).abs() / scale).max())
            q_err = float(((q - quad).abs() / scale).max())
            ok = err <= tol and q_err <= max(tol, 10 * q_noise)
            checks[backend] = BackendCheck(
                backend,
                ok,
                rel_error_fd=err,
                quadratic_error=q_err,
                worst_params=() if ok else worst_params(op_rev.space, HV, ref),
            )
    exact, reference = ForwardBackend.name, ReverseBackend.name
    agreement = rel_error(products[exact], products[reference]) if len(products) == 2 else None
    _explain(checks, customs, tol, messages)
    (other,) = checks.keys() - {preferred}  # the other exact backend
    if checks[preferred].ok:
        recommended = preferred
    elif checks[other].ok:
        recommended = other
        messages.append(f"falling back from the {preferred} backend to the {other} backend")
    else:
        recommended = None
        messages.append(
            "no HVP backend is trustworthy for this model: curvature probes must not run "
            "(replace the op named above by a differentiable implementation, e.g. eager attention / "
            "a pure-PyTorch activation)"
        )
    return SecondOrderReport(
        model=type(model).__name__,
        family=family_of(model),
        dtype=str(dtype).replace("torch.", ""),
        dim=op_rev.dim,
        attention=attention,
        reverse=checks[ReverseBackend.name],
        forward=checks[ForwardBackend.name],
        backend_agreement=agreement,
        fd_noise=fd_noise,
        rtol=tol,
        custom_functions=customs,
        recommended=recommended,
        messages=tuple(messages),
        seconds=time.perf_counter() - t0,
        checked_on=checked_on,
    )


def _explain(checks: dict[str, BackendCheck], customs: tuple[str, ...], tol: float, messages: list[str]) -> None:
    suspects = ", ".join(customs) if customs else "none found (the op is a built-in one)"
    for backend, chk in checks.items():
        if chk.ok:
            continue
        if chk.error is not None:
            ops = f" (op: {', '.join(chk.ops)})" if chk.ops else ""
            messages.append(
                f"{backend} backend raised{ops}: {chk.error}; custom autograd Functions in the graph: {suspects}"
            )
        else:
            where = ", ".join(f"{n} ({e:.2g})" for n, e in chk.worst_params)
            messages.append(
                f"{backend} backend gives a WRONG Hessian: relative error {chk.rel_error_fd:.2g} against the "
                f"gradient difference and {chk.quadratic_error:.2g} against the loss's second difference "
                f"(tolerance {tol:.1g}); worst parameters: {where}; custom autograd Functions in the graph "
                f"(a backward that is not the derivative of its forward, or not itself differentiable, is "
                f"the usual cause): {suspects}"
            )


# --------------------------------------------------------------------------- handling


@contextlib.contextmanager
def curvature_safe(model: nn.Module, quiet: bool = False) -> Iterator[nn.Module]:
    """Switch ops without second-order / forward-AD rules to implementations that have them.

    * attention implementations other than ``eager``/``sdpa`` (flash-attention, flex, hub kernels)
      → ``sdpa`` (which the HVP operators run under the MATH backend);
    * xIELU's CUDA kernel (``xielu`` wheel, a ``torch.classes`` op with no autograd) → its
      pure-PyTorch path.

    Everything is restored on exit. A :class:`SecondOrderWarning` names each switch (unless ``quiet``).
    """
    undo: list[Callable[[], None]] = []
    config = getattr(model, "config", None)
    attn = getattr(config, "_attn_implementation", None)
    if attn not in (None, "eager", "sdpa") and hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("sdpa")
            undo.append(lambda: model.set_attn_implementation(attn))
            if not quiet:
                warnings.warn(
                    f"attention {attn!r} has no double-backward/forward-AD rule; using sdpa (MATH backend) "
                    "for curvature",
                    SecondOrderWarning,
                    stacklevel=3,
                )
        except Exception as e:  # noqa: BLE001
            warnings.warn(
                f"attention {attn!r} could not be switched to sdpa ({e}); curvature may fail",
                SecondOrderWarning,
                stacklevel=3,
            )
    for name, mod in model.named_modules():
        if type(mod).__name__ == "XIELUActivation" and getattr(mod, "_xielu_cuda_obj", None) is not None:
            obj = mod._xielu_cuda_obj
            mod._xielu_cuda_obj = None
            undo.append(lambda mod=mod, obj=obj: setattr(mod, "_xielu_cuda_obj", obj))
            if not quiet:
                warnings.warn(
                    f"{name}: the xIELU CUDA kernel has no autograd rules; using its PyTorch path for curvature",
                    SecondOrderWarning,
                    stacklevel=3,
                )
    try:
        yield model
    finally:
        for f in reversed(undo):
            f()


_CACHE: dict[str, SecondOrderReport] = {}


def architecture_key(model: nn.Module, params=None) -> str:
    """Key identifying an architecture (class, config, dtype, device, params) for caching checks."""
    cfg = getattr(model, "config", None)
    try:
        cfg_s = json.dumps(cfg.to_dict(), sort_keys=True, default=str) if cfg is not None else ""
    except Exception:  # noqa: BLE001
        cfg_s = repr(cfg)
    p = next(model.parameters())
    shapes = [(n, tuple(q.shape)) for n, q in model.named_parameters()][:4]
    return f"{type(model).__name__}|{p.dtype}|{p.device.type}|{params!r}|{shapes}|{hash(cfg_s)}"


def ensure_second_order(
    model: nn.Module,
    batch,
    backend: str = DEFAULT_BACKEND,
    params=None,
    loss_fn=None,
    cache: bool = True,
    precision: str | torch.dtype = "auto",
    build=None,
) -> str:
    """The HVP backend to use for ``model``: ``backend`` when trustworthy, else the other one with a
    :class:`SecondOrderWarning` naming the op; raises :class:`SecondOrderError` when neither is.

    Runs :func:`check_second_order` on ``batch`` (trim it to ~2×8 tokens: the check costs
    2 HVPs + 8 gradients per probe vector) once per architecture (:func:`architecture_key`), so a
    sweep over a trajectory pays once. ``precision``: :func:`check_second_order`'s (``"miniature"``
    when a memory budget leaves no room for a float64 copy: :mod:`losslens.geometry.operators.setup_plan`);
    ``build``: :func:`check_second_order`'s (the set-up's miniature). Use as::

        backend = ensure_second_order(model, curvature_batches[0][:2, :16], backend="reverse")
        op = HessianOperator(model, lm_loss, batches, backend=backend)
    """
    key = architecture_key(model, params) + f"|{backend}|{precision}"
    rep = _CACHE.get(key) if cache else None
    if rep is None:
        rep = check_second_order(
            model, batch, loss_fn=loss_fn, params=params, preferred=backend, precision=precision, build=build
        )
        if cache:
            _CACHE[key] = rep
        if rep.usable and rep.recommended != backend:
            warnings.warn(rep.message(), SecondOrderWarning, stacklevel=2)
        elif rep.usable and not rep.ok:
            warnings.warn(rep.message(), SecondOrderWarning, stacklevel=2)
    if not rep.usable:
        raise SecondOrderError(rep.message())
    return rep.recommended

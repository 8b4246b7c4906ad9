"""What the second-order check found: :class:`BackendCheck` (one HVP backend against the
finite-difference reference) and :class:`SecondOrderReport` (both backends, the custom autograd
Functions in the loss graph, the recommended backend), as returned by
:func:`losslens.lm.models.second_order.check_second_order`."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BackendCheck:
    """How one HVP backend did on the probe batch.

    Attributes:
        backend: ``"reverse"`` or ``"forward"``.
        ok: ran and matched the finite-difference reference within tolerance.
        error: the exception (type: message) when it raised, else None.
        rel_error_fd: ‖Hv − FD‖ / ‖FD‖ over the probe vectors (None when it raised).
        quadratic_error: max over probe vectors of ``|vᵀHv − q(v)|`` / ‖Hv‖, with q the second
            difference of the loss (catches a first-order backward that is not the derivative).
        worst_params: up to 3 ``(parameter, relative error)`` with the largest mismatch (when not ok).
        ops: op / Function names extracted from the error message.
    """

    backend: str
    ok: bool
    error: str | None = None
    rel_error_fd: float | None = None
    quadratic_error: float | None = None
    worst_params: tuple[tuple[str, float], ...] = ()
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecondOrderReport:
    """Result of :func:`check_second_order`.

    Attributes:
        model: model class name; family: :data:`FAMILIES` key or None.
        dtype: dtype the check ran in; dim: number of parameters probed.
        attention: the model's ``attn_implementation`` (None for non-HF models).
        reverse, forward: :class:`BackendCheck` per backend.
        backend_agreement: ‖H_rev v − H_fwd v‖ / ‖H_rev v‖ (None unless both ran).
        fd_noise: relative difference of the FD reference at steps ε and ε/2 (its own accuracy).
        rtol: tolerance used against the FD reference.
        custom_functions: ``"module (Class): FunctionBackward"`` for every custom autograd Function
            found in the loss graph (the usual culprits of missing/incorrect rules).
        recommended: the backend to use (the preferred one when ok, else the other one when ok),
            or None when neither is trustworthy.
        messages: human-readable findings (each names the op when one is at fault).
        seconds: wall time.
        checked_on: ``"model"``, ``"float64 copy"`` or ``"float64 miniature"`` (a tiny model of
            the same class and config pattern, :func:`losslens.lm.models.miniature.miniature`).
    """

    model: str
    family: str | None
    dtype: str
    dim: int
    attention: str | None
    reverse: BackendCheck
    forward: BackendCheck
    backend_agreement: float | None
    fd_noise: float
    rtol: float
    custom_functions: tuple[str, ...]
    recommended: str | None
    messages: tuple[str, ...]
    seconds: float
    checked_on: str = "model"

    @property
    def ok(self) -> bool:
        """Both backends are trustworthy."""
        return self.reverse.ok and self.forward.ok

    @property
    def usable(self) -> bool:
        """At least one backend is trustworthy."""
        return self.recommended is not None

    def message(self) -> str:
        """One paragraph summarising the findings."""
        head = (
            f"second-order check of {self.model} ({self.dtype}, {self.dim} parameters, attention "
            f"{self.attention}): reverse {'ok' if self.reverse.ok else 'FAILED'}, forward "
            f"{'ok' if self.forward.ok else 'FAILED'}; recommended backend: {self.recommended}"
        )
        return head + ("" if not self.messages else "\n  - " + "\n  - ".join(self.messages))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["usable"] = self.usable
        return d

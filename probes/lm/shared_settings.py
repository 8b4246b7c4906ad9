"""Settings objects: the options of the workflow's functions, each declared once with its default.

A settings object is a frozen dataclass marked with :func:`settings`. The library's command functions
(``losslens.sharpness``, ``losslens.quantize``, ...) take them as keyword parameters, one per group
(``memory: MemoryOptions = MemoryOptions()``); :func:`keywords` turns such a function into one that
takes the groups' fields as plain keyword parameters (``max_memory="8GB"``) with the defaults of the
function's default instances, and the CLI (:mod:`losslens.cli.option_parsing`) lists the same fields
as command-line options (``--max-memory``), adding only their flags and help. Nothing here imports
torch.

Shared groups: :class:`TrajectoryOptions` (hub cache, LR schedule, tokens per step),
:class:`CheckpointOptions` (those and the label), :class:`LoadOptions` (device, dtype, pickle),
:class:`MemoryOptions` (the estimators' budget, ``strict_memory``), :class:`StateOptions` (where solver
state and the sharded operator's copy of θ live), :class:`ComputeOptions` (HVP backend, compute dtype,
threads, parallelism) and :class:`ErrorOptions` (the products' error tolerance).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Optional

from losslens.geometry.base.errors import LosslensError

_MARK = "__losslens_settings__"
WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "float64")
"""The dtypes checkpoint weights may be loaded in (``dtype``, ``--dtype``)."""


class SettingsError(LosslensError, ValueError):
    """A setting with a value the library cannot use; the message names the option and the value."""


def settings(cls: type) -> type:
    """Mark the frozen dataclass ``cls`` as a settings object (a group :func:`keywords` and the CLI expand)."""
    setattr(cls, _MARK, True)
    return cls


def is_settings(tp: Any) -> bool:
    """Whether ``tp`` is a settings class (a dataclass marked with :func:`settings`)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and getattr(tp, _MARK, False) is True


def groups_of(func: Callable[..., Any], is_group: Callable[[Any], bool] = is_settings) -> dict[str, type]:
    """``func``'s settings parameters: parameter name -> settings class, in signature order."""
    sig = inspect.signature(func, eval_str=True)
    return {p.name: p.annotation for p in sig.parameters.values() if is_group(p.annotation)}


def expand(
    func: Callable[..., Any], is_group: Callable[[Any], bool] = is_settings
) -> tuple[inspect.Signature, dict[str, tuple[type, list[str]]]]:
    """``func``'s signature with each settings parameter replaced by the group's fields (keyword-only,
    annotated with the field's type, defaulting to the parameter's default instance's value), and
    the groups: parameter name -> (class, field names). Raises ``TypeError`` on a field name that is
    also a parameter of ``func`` or of another group."""
    sig = inspect.signature(func, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in sig.parameters.values():
        if not is_group(p.annotation):
            params.append(p)
            continue
        cls = p.annotation
        default = p.default if p.default is not inspect.Parameter.empty else cls()
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        params.extend(
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=getattr(default, n), annotation=hints[n])
            for n in names
        )
        groups[p.name] = (cls, names)
    seen = [p.name for p in params]
    clash = sorted({n for n in seen if seen.count(n) > 1})
    if clash:
        raise TypeError(f"{func.__name__}: option(s) {clash} declared twice")
    return sig.replace(parameters=params), groups


def keywords(func: Callable[..., Any], name: str | None = None, doc: str | None = None) -> Callable[..., Any]:
    """``func`` taking its settings groups' fields as plain keyword parameters: ``f(x, max_memory="8GB")``
    calls ``func(x, memory=MemoryOptions(max_memory="8GB"))`` (the other fields from ``func``'s default
    instance). A whole group may also be passed by its parameter name (``memory=MemoryOptions(...)``);
    fields given beside it replace its values. Unknown names raise ``TypeError``. ``name`` / ``doc``: the
    function's ``__name__`` and docstring (default ``func``'s)."""
    flat, groups = expand(func)
    outer = inspect.signature(func)

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        for name, (cls, fields) in groups.items():
            base = kwargs.pop(name, None)
            if base is None:
                default = outer.parameters[name].default
                base = cls() if default is inspect.Parameter.empty else default
            own = {f: kwargs.pop(f) for f in fields if f in kwargs}
            kwargs[name] = dataclasses.replace(base, **own) if own else base
        bad = sorted(set(kwargs) - set(outer.parameters))
        if bad:
            raise TypeError(f"{func.__name__}() got unexpected keyword argument(s) {bad}")
        return func(*args, **kwargs)

    if name:
        call.__name__ = call.__qualname__ = name
    if doc:
        call.__doc__ = doc
    call.__signature__ = flat  # type: ignore[attr-defined]
    call.__wrapped_settings__ = func  # type: ignore[attr-defined]
    return call


@settings
@dataclasses.dataclass(frozen=True)
class TrajectoryOptions:
    """Where hub revisions are read from, and the LR and tokens each checkpoint is given
    (:func:`losslens.lm.checkpoints.open_trajectory`)."""

    cache_dir: Optional[Path] = None
    schedule: Optional[str] = None
    tokens_per_step: Optional[int] = None


@settings
@dataclasses.dataclass(frozen=True)
class CheckpointOptions(TrajectoryOptions):
    """:class:`TrajectoryOptions` and the label that picks one checkpoint of a trajectory
    (:func:`losslens.lm.checkpoints.open_checkpoint`; None: the last)."""

    label: Optional[str] = None


@settings
@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How checkpoint weights are loaded (:class:`losslens.lm.checkpoints.CheckpointLoader`): the device
    (None: the command's default), the dtype (one of :data:`WEIGHT_DTYPES`; None: float32) and whether
    torch files that need full pickle may be read."""

    device: Optional[str] = None
    dtype: Optional[str] = None
    allow_pickle: bool = False

    def check_dtype(self) -> None:
        """:class:`SettingsError` naming ``--dtype`` when the dtype is not one of :data:`WEIGHT_DTYPES`."""
        if self.dtype is not None and self.dtype not in WEIGHT_DTYPES:
            raise SettingsError(f"--dtype {self.dtype!r} is unknown; valid: {', '.join(WEIGHT_DTYPES)}")

    def torch_dtype(self):
        """The dtype as a ``torch.dtype`` (None keeps the loader's float32); checked first. Imports torch."""
        self.check_dtype()
        if self.dtype is None:
            return None
        import torch

        return getattr(torch, self.dtype)


@settings
@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """The memory each curvature estimator may use beyond the model (``"8GB"``; None: a third of the RAM,
    80% of the GPU memory the model does not hold: :mod:`losslens.geometry.memory.model`), and whether
    it is a cap on resident memory (``strict_memory``; None: on when ``max_memory`` is given)."""

    max_memory: Optional[str] = None
    strict_memory: Optional[bool] = None

    def apply(self) -> bool:
        """:func:`apply_strict_memory` with these options; call it first thing in a command."""
        return apply_strict_memory(self.strict_memory, self.max_memory)


@settings
@dataclasses.dataclass(frozen=True)
class ComputeOptions:
    """How the Hessian-vector products run: the backend (``reverse``, ``forward``, ``difference``,
    ``auto``; :class:`losslens.geometry.HessianOperator`), the compute dtype
    (:mod:`losslens.geometry.operators.precision`), torch's threads and the ranks under torchrun
    (``parallel``: ``none``, ``data``, ``fsdp``; :mod:`losslens.lm.core.distributed`)."""

    backend: Optional[str] = "reverse"
    compute_dtype: Optional[str] = None
    threads: Optional[int] = None
    parallel: str = "none"


@settings
@dataclasses.dataclass(frozen=True)
class ErrorOptions:
    """When a result is flagged for its Hessian products' measured error (relative error above
    ``error_tolerance``: :func:`losslens.lm.models.curvature.error_warning`, a
    :class:`~losslens.geometry.base.errors.ProductErrorWarning`), and whether the CLI then exits 1
    (``strict``; from Python: ``warnings.simplefilter("error", ProductErrorWarning)``)."""

    error_tolerance: float = 1e-2
    strict: bool = False


STATE_DEVICES = ("device", "cpu", "disk")
"""Where the estimators' solver state may live (``state_device``, ``--state-device``)."""
MASTER_DEVICES = ("device", "cpu")
"""Where the sharded operator's kept copy of θ may live (``master_device``, ``--master-device``)."""


@settings
@dataclasses.dataclass(frozen=True)
class StateOptions:
    """Where the large state lives (issue #48; :mod:`losslens.geometry.base.state_store`): the estimators'
    solver state, a Lanczos basis or a Hutch++ sketch (``state_device``: ``"device"``, the operator's;
    ``"cpu"``, host RAM, pinned on a GPU; ``"disk"``, memory-mapped in ``$LOSSLENS_STATE_DIR``), planned
    in the memory plan's host part with its transfer time; and the copy of θ the sharded operator
    restores θ from (``master_device``: ``"device"`` or ``"cpu"``, moved in per perturbation;
    ``parallel="fsdp"`` only, :class:`losslens.geometry.operators.sharded.ShardedHessianOperator`)."""

    state_device: str = "device"
    master_device: str = "device"

    def check(self, parallel: str) -> None:
        """:class:`SettingsError` naming the option for a place not in :data:`STATE_DEVICES` /
        :data:`MASTER_DEVICES`, or a master off the device without ``parallel="fsdp"``."""
        if self.state_device not in STATE_DEVICES:
            raise SettingsError(f"--state-device {self.state_device!r} is unknown; valid: {', '.join(STATE_DEVICES)}")
        if self.master_device not in MASTER_DEVICES:
            raise SettingsError(
                f"--master-device {self.master_device!r} is unknown; valid: {', '.join(MASTER_DEVICES)}"
            )
        if self.master_device != "device" and parallel != "fsdp":
            raise SettingsError(
                f"--master-device {self.master_device} needs --parallel fsdp: only the sharded operator keeps a "
                "copy of θ (the other paths differentiate at θ itself)"
            )

    @property
    def basis_device(self) -> str | None:
        """The estimators' ``basis_device`` (None: the operator's device)."""
        return None if self.state_device == "device" else self.state_device

    @property
    def master(self) -> str | None:
        """The sharded operator's ``master_device`` (None: its device)."""
        return None if self.master_device == "device" else self.master_device


def apply_strict_memory(strict: bool | None, max_memory: str | None = None) -> bool:
    """``strict_memory`` (``None``: on when ``max_memory`` was given):
    :func:`losslens.geometry.memory.allocator.return_freed_memory` with the 64 kB mmap threshold measured to keep
    peak RSS within the plan (:data:`~losslens.geometry.memory.allocator.STRICT_MMAP_THRESHOLD`). Returns whether
    it is on. Raises :class:`SettingsError` when asked for explicitly off glibc, where the setting does not
    exist; when implied by ``max_memory`` there it is skipped (the budget stays a plan). A bad ``max_memory``
    is refused first, before any work (:func:`check_max_memory`)."""
    if max_memory is not None:
        check_max_memory(max_memory)
    if strict is False or (strict is None and max_memory is None):
        return False
    from losslens.geometry.memory.allocator import STRICT_MMAP_THRESHOLD, return_freed_memory

    if return_freed_memory(STRICT_MMAP_THRESHOLD):
        return True
    if strict:
        raise SettingsError(
            "--strict-memory needs glibc's malloc (Linux); this process's C library has no mallopt: drop "
            "--strict-memory and leave headroom beyond --max-memory"
        )
    return False


def check_max_memory(max_memory: str) -> int:
    """``max_memory`` in bytes, read by the one size parser (:func:`losslens.geometry.memory.budget.parse_bytes`:
    a number and a unit, from 1 MB to this machine's memory); :class:`SettingsError` naming ``--max-memory``
    and saying what was read and what is accepted otherwise."""
    from losslens.geometry.memory.budget import MemoryBudgetError, parse_bytes

    try:
        return parse_bytes(max_memory)
    except MemoryBudgetError as exc:
        raise SettingsError(f"--max-memory: {exc}") from None


__all__ = [
    "WEIGHT_DTYPES",
    "CheckpointOptions",
    "ComputeOptions",
    "ErrorOptions",
    "LoadOptions",
    "MemoryOptions",
    "MASTER_DEVICES",
    "STATE_DEVICES",
    "SettingsError",
    "StateOptions",
    "TrajectoryOptions",
    "apply_strict_memory",
    "check_max_memory",
    "expand",
    "groups_of",
    "is_settings",
    "keywords",
    "settings",
]

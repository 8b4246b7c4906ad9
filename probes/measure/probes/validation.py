"""The checks every probe's settings share: :class:`PlanError` (what a bad plan raises), integers,
quantizer spec lists and settings tables (a TOML table → a settings dataclass)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from losslens.geometry.base.errors import LosslensError

_FALLBACK_QUANT_METHODS = ("rtn", "int8", "gptq")


class PlanError(LosslensError, ValueError):
    """A plan names an unknown probe, option or spec, or has an invalid value."""


def positive_int(name: str, v, minimum: int = 1) -> None:
    """Raise :class:`PlanError` unless ``v`` is an int (not a bool) ≥ ``minimum``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise PlanError(f"{name} must be an integer >= {minimum}, got {v!r}")


def canonical_spec(spec: str, where: str = "spec") -> str:
    """Validate a quantizer spec and return its canonical string (``str(QuantSpec.parse(spec))``
    when :mod:`losslens.lm.quant` is installed; a basic grammar check otherwise)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PlanError(f"{where}: a quantizer spec must be a non-empty string like 'rtn:4:g128', got {spec!r}")
    spec = spec.strip()
    try:
        from losslens.lm.quant import QuantSpec  # type: ignore
    except ImportError:
        QuantSpec = None
    if QuantSpec is not None:
        try:
            return str(QuantSpec.parse(spec))
        except Exception as exc:
            raise PlanError(f"{where}: invalid quantizer spec {spec!r}: {exc}") from exc
    method = spec.split(":", 1)[0]
    if method not in _FALLBACK_QUANT_METHODS:
        raise PlanError(
            f"{where}: unknown quantizer {method!r} in spec {spec!r}; "
            f"valid quantizers: {', '.join(_FALLBACK_QUANT_METHODS)}"
        )
    return spec


def spec_list(name: str, value) -> tuple[str, ...]:
    """A probe's list of quantizer specs (a string is one spec), canonical, each listed once."""
    specs = tuple(canonical_spec(s, name) for s in ((value,) if isinstance(value, str) else value))
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise PlanError(f"{name} lists {dup} more than once")
    return specs


def flag(name: str, value) -> bool:
    """A probe that is on or off (``loss = true``)."""
    if not isinstance(value, bool):
        raise PlanError(f"{name} must be true or false, got {value!r}")
    return value


def settings_from_table(cls, d: Mapping, where: str):
    """``cls(**d)`` for a settings table ``d`` (lists become tuples, except block groups); unknown
    keys raise :class:`PlanError` naming the valid ones."""
    valid = [f.name for f in fields(cls)]
    unknown = [k for k in d if k not in valid]
    if unknown:
        raise PlanError(f"{where}: unknown option(s) {unknown}; valid options: {', '.join(valid)}")
    kw = dict(d)
    for k, v in kw.items():
        if isinstance(v, list) and k != "groups":
            kw[k] = tuple(v)
    return cls(**kw)


def optional_settings(name: str, cls, value: Any):
    """A probe with a settings class: None/False (off), True (default settings), a table or an instance."""
    if value is None or isinstance(value, cls):
        return value
    if value is True:
        return cls()
    if value is False:
        return None
    if isinstance(value, Mapping):
        return settings_from_table(cls, value, name)
    raise PlanError(f"{name} must be a {cls.__name__}, a table of its options, true/false; got {value!r}")


__all__ = [
    "PlanError",
    "positive_int",
    "canonical_spec",
    "spec_list",
    "flag",
    "settings_from_table",
    "optional_settings",
]

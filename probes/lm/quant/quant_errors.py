"""Exceptions of :mod:`losslens.lm.quant`. All derive from :class:`QuantizeError` (a ``ValueError``).

A module glob that matches nothing raises :class:`losslens.lm.core.modules.ModuleSelectionError` (also a
``ValueError``), re-exported here for convenience.
"""

from __future__ import annotations

from losslens.geometry.base.errors import LosslensError
from losslens.lm.core.modules import ModuleSelectionError  # noqa: F401  (re-export)


class QuantizeError(LosslensError, ValueError):
    """Quantization could not be done as asked."""


class SpecError(QuantizeError):
    """A quantizer spec is malformed: unknown method, bits outside 2..8, bad group size or option."""


class CalibrationError(QuantizeError):
    """Calibration data missing (GPTQ needs it), malformed, or too small for the model."""


class BackendUnavailable(QuantizeError):
    """An optional backend (gptqmodel, bitsandbytes) is not installed or cannot run here."""


class CholeskyError(QuantizeError):
    """The damped Hessian of a layer stayed non positive-definite even at the largest damping."""

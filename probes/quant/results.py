"""What quantization returns: the quantized model and a report per layer."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .spec import QuantSpec

__all__ = ["LayerReport", "QuantizedModel"]


@dataclass(frozen=True)
class LayerReport:
    """What quantization did to one linear layer.

    Attributes:
        name: dotted module name.
        rel_weight_error: ‖Ŵ − W‖_F / ‖W‖_F (0 when W = 0 and Ŵ = 0).
        seconds: wall time spent on this layer (for GPTQ the per-layer algorithm, not the forwards).
        damping: GPTQ λ actually used (None for calibration-free methods).
        notes: anything unusual (dead input columns, Cholesky retries with more damping, fallbacks).
    """

    name: str
    rel_weight_error: float
    seconds: float
    damping: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "rel_weight_error": self.rel_weight_error, "seconds": self.seconds,
                "damping": self.damping, "notes": list(self.notes)}


@dataclass
class QuantizedModel:
    """A fake-quantized model with its spec and per-layer report.

    Attributes:
        model: the quantized ``nn.Module`` (a deep copy unless ``inplace=True`` was asked).
        spec: the :class:`QuantSpec` used (``str(spec)`` is the canonical string to record).
        report: one :class:`LayerReport` per quantized linear, in quantization order.
        seconds: total wall time of :func:`quantize`.
    """

    model: nn.Module
    spec: QuantSpec
    report: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def layer_errors(self) -> dict[str, float]:
        """Relative weight error per quantized layer name."""
        return {r.name: r.rel_weight_error for r in self.report}

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.report]

    def notes(self) -> list[str]:
        """Every layer note, prefixed by the layer name."""
        return [f"{r.name}: {n}" for r in self.report for n in r.notes]

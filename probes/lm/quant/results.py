"""What quantization returns: the quantized model and a report per layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from losslens.lm.quant.spec import QuantSpec

__all__ = ["CalibObjective", "LayerReport", "QuantizedModel", "write_weight"]


def write_weight(lin: nn.Module, new: torch.Tensor) -> None:
    """Write a quantizer's result into ``lin.weight`` in place (same tensor, cast to its dtype and
    device, reshaped to its shape), through autograd's own in-place copy so the parameter's version
    counter moves: curvature code that keeps graphs of the old weights sees the change
    (``.data.copy_`` would not bump it: issue #23)."""
    with torch.no_grad():
        lin.weight.copy_(new.reshape(lin.weight.shape).to(device=lin.weight.device, dtype=lin.weight.dtype))


@dataclass(frozen=True)
class CalibObjective:
    """What a calibration search (AWQ) optimised for one input-sharing group, and what it reached.

    All errors are the group's output MSE on the calibration inputs of the full-precision model,
    E = Σ_j ‖X (Ŵ_j − W_j)ᵀ‖²_F / (n · Σ_j out_j) (:mod:`losslens.lm.quant.awq`; units: squared
    activations).

    Attributes:
        rtn: E of plain RTN at the same bits and group size (α = 0, no clipping).
        scaled: E after the scale search, before clipping (≤ ``rtn``).
        final: E of the weights the model holds (≤ ``scaled`` ≤ ``rtn`` by construction).
        alpha: the chosen scale exponent α*.
        group: names of the linears sharing the input (execution order).
        n_tokens: calibration token rows n.
    """

    rtn: float
    scaled: float
    final: float
    alpha: float
    group: tuple[str, ...]
    n_tokens: int

    @property
    def ratio(self) -> float:
        """final / rtn (1.0 when RTN is already exact on these inputs)."""
        return self.final / self.rtn if self.rtn > 0 else 1.0

    def to_dict(self) -> dict:
        return {
            "rtn": self.rtn,
            "scaled": self.scaled,
            "final": self.final,
            "alpha": self.alpha,
            "group": list(self.group),
            "n_tokens": self.n_tokens,
            "ratio": self.ratio,
        }


@dataclass(frozen=True)
class LayerReport:
    """What quantization did to one linear layer.

    Attributes:
        name: dotted module name.
        rel_weight_error: ‖Ŵ − W‖_F / ‖W‖_F (0 when W = 0 and Ŵ = 0).
        seconds: wall time spent on this layer (for GPTQ the per-layer algorithm, not the forwards).
        damping: GPTQ λ actually used (None for calibration-free methods).
        notes: anything unusual (dead input columns, Cholesky retries with more damping, fallbacks).
        objective: for AWQ, the calibration objective of the layer's input-sharing group
            (:class:`CalibObjective`, shared by the group's layers); None for other methods and for
            linears AWQ had to quantize with plain RTN (never called on the calibration data).
    """

    name: str
    rel_weight_error: float
    seconds: float
    damping: float | None = None
    notes: tuple[str, ...] = ()
    objective: CalibObjective | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "rel_weight_error": self.rel_weight_error,
            "seconds": self.seconds,
            "damping": self.damping,
            "notes": list(self.notes),
            "objective": None if self.objective is None else self.objective.to_dict(),
        }


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

    @property
    def calib_objective_ratio(self) -> float | None:
        """Mean over the input-sharing groups of E_final / E_RTN on the calibration inputs
        (:class:`CalibObjective`; ≤ 1 by construction for AWQ). None when no layer carries an
        objective (every method but AWQ). Each group counts once, however many linears it has."""
        groups = {r.objective.group: r.objective for r in self.report if r.objective is not None}
        if not groups:
            return None
        return sum(o.ratio for o in groups.values()) / len(groups)

    def notes(self) -> list[str]:
        """Every layer note, prefixed by the layer name."""
        return [f"{r.name}: {n}" for r in self.report for n in r.notes]

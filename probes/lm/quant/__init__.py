"""Post-training weight quantization of language models and its loss error (docs/science.md §2–3).

One interface for every quantizer::

    from losslens.lm.quant import QuantSpec, quantize, quantization_error
    qm = quantize(model, "gptq:4:g128", calibration=token_sets["calibration"])
    qm.model            # fake-quantized deep copy (the original is untouched)
    qm.report           # [LayerReport(name, rel_weight_error, seconds, damping, notes, objective), ...]
    err = quantization_error(model, "rtn:4:g128", token_sets["eval"])
    err.rel_loss_error, err.ppl_gap

Methods: ``rtn`` (asymmetric per-group INT-b), ``int8`` (per-channel absmax), ``gptq`` (native,
reference-exact, sequential; ``gptq:4:g128:gptqmodel`` is GPTQModel's default algorithm), ``awq``
(activation-aware scaling + clipping; never worse than RTN on its calibration objective, but ΔQ L on
held-out data can be: :mod:`.awq`), optional ``gptqmodel``, ``bnb-int8``, ``bnb-nf4`` backends.
Deployment formats (specs ``fp8``, ``mxfp4``, ``mxfp8``, ``nvfp4``, ``gguf:TYPE``; the ``had+`` rotation
prefix): :mod:`.formats` (spec table), :mod:`.minifloat` (FP8/FP4 rounding), :mod:`.microscaling`
(MX, NVFP4), :mod:`.ggml` + :mod:`.ggml_kquants` (llama.cpp types), :mod:`.hadamard`.
Modules: :mod:`.spec` (QuantSpec), :mod:`.rtn` (RTN/INT8 + the INT-b grid), :mod:`.gptq` (per-layer
GPTQ), :mod:`.gptq_preset` (GPTQModel's default GPTQ: the ``gptq:…:gptqmodel`` preset),
:mod:`.sequential` (model-level GPTQ driver), :mod:`.awq` (AWQ over a model), :mod:`.awq_search` (its
search on one group of linears), :mod:`.backends`,
:mod:`.dispatch` (quantize), :mod:`.results` (QuantizedModel, LayerReport, CalibObjective), :mod:`.metrics`
(quantization_error), :mod:`.plane` (the quantization plane A = Θ_K, B = Θ_{K−1}, C = Θ̂_K).
"""

from losslens.lm.core.numerics import rel_error

from losslens.lm.quant.dispatch import calibration_batches, quantize
from losslens.lm.quant.quant_errors import (
    BackendUnavailable,
    CalibrationError,
    CholeskyError,
    ModuleSelectionError,
    QuantizeError,
    SpecError,
)
from losslens.lm.quant.gptq import GPTQResult, gptq_quantize
from losslens.lm.quant.metrics import QuantError, quantization_error
from losslens.lm.quant.results import CalibObjective, LayerReport, QuantizedModel
from losslens.lm.quant.rtn import fit_grid, int8_quantize, quantize_grid, rtn_quantize
from losslens.lm.quant.spec import METHODS, QuantSpec

__all__ = [
    "QuantSpec",
    "METHODS",
    "quantize",
    "QuantizedModel",
    "LayerReport",
    "CalibObjective",
    "quantization_error",
    "QuantError",
    "rtn_quantize",
    "int8_quantize",
    "fit_grid",
    "quantize_grid",
    "gptq_quantize",
    "GPTQResult",
    "calibration_batches",
    "rel_error",
    "QuantizeError",
    "SpecError",
    "CalibrationError",
    "BackendUnavailable",
    "CholeskyError",
    "ModuleSelectionError",
]

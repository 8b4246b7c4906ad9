"""Optional quantization backends behind the same interface; never hard dependencies.

* ``bnb-int8`` — bitsandbytes' int8 weight format (``int8_vectorwise_quant``: per-row absmax, the
  weight side of LLM.int8). Fake-quantized: the Linear keeps dequantized float weights, so the
  activations are *not* quantized and no outlier decomposition happens (that belongs to the int8
  matmul, not to the stored weights). ``threshold=`` is accepted for the record only.
* ``bnb-nf4[:g<N>]`` — bitsandbytes NF4 (``quantize_4bit`` / ``dequantize_4bit``, block size N,
  default 64), dequantized back into the Linear. Runs on CPU in bitsandbytes >= 0.50.
* ``gptqmodel:...`` — GPTQ through the GPTQModel package (if installed): the model is saved to a
  temporary folder, quantized there by GPTQModel with the same calibration token ids, and the
  dequantized weights are copied back into the selected linears.

:func:`available` says which are importable.
"""

from __future__ import annotations

import importlib.util
import time

import torch
from torch import nn

from losslens.lm.core.numerics import rel_error

from losslens.lm.quant.quant_errors import BackendUnavailable, QuantizeError
from losslens.lm.quant.results import LayerReport, write_weight


def available() -> dict[str, bool]:
    """Which optional backends are installed: ``{"bitsandbytes": bool, "gptqmodel": bool}``."""
    return {name: importlib.util.find_spec(name) is not None for name in ("bitsandbytes", "gptqmodel")}


def _need(pkg: str, spec) -> None:
    if not available()[pkg]:
        raise BackendUnavailable(f"{spec} needs the optional package {pkg!r}: pip install {pkg}")


def quantize_with_backend(model: nn.Module, spec, linears: dict[str, nn.Linear], batches, progress: bool = False):
    """Quantize ``linears`` of ``model`` in place with a backend; returns the list of LayerReports."""
    if spec.method in ("bnb-int8", "bnb-nf4"):
        _need("bitsandbytes", spec)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import bitsandbytes.functional as bf
        report = []
        for name, lin in linears.items():
            t0 = time.perf_counter()
            W = lin.weight.data
            Wf = W.float()
            if spec.method == "bnb-int8":
                q, scb, _ = bf.int8_vectorwise_quant(Wf.to(torch.float16) if Wf.is_cuda else Wf)
                new = q.float() * (scb.float().unsqueeze(1) / 127.0)
                notes = ("bitsandbytes int8 weights (per-row absmax); activations not quantized",)
            else:
                # flattened: bitsandbytes 0.50.2's CPU dequantize_4bit kernel is wrong for 2-D weights whose
                # rows are not a multiple of the block size (e.g. [64, 32] with blocks of 64: up to 0.8
                # relative error); NF4 blocks run over the flattened tensor anyway, so this is the same format
                qt, state = bf.quantize_4bit(Wf.reshape(-1), blocksize=spec.group_size, quant_type="nf4")
                new = bf.dequantize_4bit(qt, state).float().reshape(W.shape)
                notes = (f"bitsandbytes NF4, block size {spec.group_size}",)
            err = rel_error(new, W)
            write_weight(lin, new)
            report.append(LayerReport(name, err, time.perf_counter() - t0, None, notes))
        return report
    if spec.method == "gptqmodel":
        _need("gptqmodel", spec)
        return _gptqmodel(model, spec, linears, batches)
    raise QuantizeError(f"no backend for {spec.method!r}")


def _gptqmodel(model: nn.Module, spec, linears: dict[str, nn.Linear], batches):  # pragma: no cover - optional
    """GPTQ via GPTQModel on a saved copy; copies the dequantized weights back."""
    import tempfile

    from gptqmodel import GPTQModel, QuantizeConfig

    if not hasattr(model, "save_pretrained"):
        raise BackendUnavailable("the gptqmodel backend needs a Hugging Face model (save_pretrained)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        # offload_to_disk=False: with GPTQModel 7.7.0's default the packed modules hold meta tensors on
        # CPU afterwards and dequantize_weight fails ("Cannot copy out of meta tensor"; seen by
        # benchmarks/gptqmodel_parity.py); the algorithm does not depend on it
        cfg = QuantizeConfig(
            bits=spec.bits,
            group_size=spec.group_size,
            desc_act=spec.act_order,
            sym=spec.symmetric,
            damp_percent=spec.damp,
            offload_to_disk=False,
        )
        gm = GPTQModel.load(tmp, cfg)
        calib = [
            {"input_ids": row.unsqueeze(0), "attention_mask": torch.ones_like(row).unsqueeze(0)}
            for b in batches
            for row in b
        ]
        gm.quantize(calib)
        qmods = dict(gm.model.named_modules())
        report = []
        for name, lin in linears.items():
            qm = qmods.get(name)
            if qm is None or not hasattr(qm, "dequantize_weight"):
                raise QuantizeError(f"gptqmodel did not quantize {name}")
            new = qm.dequantize_weight().T.to(lin.weight.dtype)
            err = rel_error(new, lin.weight.data)
            write_weight(lin, new)
            report.append(LayerReport(name, err, 0.0, spec.damp, ("quantized by gptqmodel",)))
    if report:
        per = (time.perf_counter() - t0) / len(report)
        report = [LayerReport(r.name, r.rel_weight_error, per, r.damping, r.notes) for r in report]
    return report

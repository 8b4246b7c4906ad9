"""Rotary-embedding tables recomputed from their definition in the compute dtype (issue #47, item 4).

A rotary embedding keeps its inverse frequencies ``inv_freq`` (and HF's ``original_inv_freq``) as
buffers computed from the config (``rope_theta``, ``head_dim``, the rope type's scaling). A model
cast to bfloat16 (``model.to(torch.bfloat16)``, a GGUF or half checkpoint so loaded) holds them
rounded to 8 bits of mantissa: a relative error up to 2^-9 in every frequency, which at position
``p`` turns into a phase error of up to ``p · 2^-9`` radians. Upcasting that buffer keeps the
rounding, so attention would run on bf16-rounded positions however wide the arithmetic (measured on
SmolLM2-135M, bf16, 4×64 tokens: whole-model products 3.9–7.3e-3 off the float64 Hessian instead of
< 1e-3). The compute-precision policy (:func:`losslens.geometry.operators.precision.computed_in`)
therefore swaps in tables recomputed by the module's own init function, in the compute dtype.

Known modules (duck-typed; ``geometry`` never imports transformers): a module with a ``config``, a
``rope_type`` (a name, or a dict by layer type as Gemma 3 keeps it) and buffers named
``inv_freq`` / ``original_inv_freq`` / ``{layer_type}_inv_freq`` / ``{layer_type}_original_inv_freq``.
Its init function is ``module.rope_init_fn`` (transformers 4.x), else
``module.compute_default_rope_parameters`` for the default type, else ``ROPE_INIT_FUNCTIONS[rope_type]``
of the module's own modeling file (transformers 5.x). HF computes in float32
(``torch.arange(..., dtype=torch.float)``); for float64 the call runs under ``_Widened``, which
turns float32 requests into float64 so the whole definition is evaluated in float64. The rope types
whose forward rewrites its tables (``dynamic``, ``longrope``) are left to the plain upcast, as is a
table whose recomputation does not agree with the stored one up to half-precision rounding (then the
stored table is not the definition's, and it is kept). Cost: one evaluation of the init function per
table and product call (a ``head_dim / 2`` vector).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["rotary_tables", "write_rotary_tables", "STATIC_ROPE_TYPES_EXCLUDED"]

#: Rope types whose forward rewrites ``inv_freq`` (HF's ``dynamic_rope_update``): never recomputed here.
STATIC_ROPE_TYPES_EXCLUDED = ("dynamic", "longrope")
_SUFFIX = "inv_freq"
_AGREE_RTOL = 2.0**-6


class _Widened(TorchFunctionMode):
    """float32 requests become float64: ``dtype=torch.float32`` arguments, ``.float()`` and
    ``.to(torch.float32)`` of float64 tensors (so a definition written for float32 runs in float64)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        wide = bool(args) and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64
        if wide and func is torch.Tensor.float:
            return args[0]
        if wide and func in (torch.Tensor.to, torch.Tensor.type):
            args = (args[0], *[torch.float64 if a is torch.float32 else a for a in args[1:]])
        return func(*args, **kwargs)


def _layer_type(buffer_name: str) -> str | None:
    """``inv_freq`` → None, ``original_inv_freq`` → None, ``sliding_attention_inv_freq`` →
    ``sliding_attention`` (and its ``original`` twin the same)."""
    stem = buffer_name[: -len(_SUFFIX)].rstrip("_")
    if stem.endswith("original"):
        stem = stem[: -len("original")].rstrip("_")
    return stem or None


def _init_fn(module: nn.Module, layer_type: str | None) -> Callable | None:
    """The module's own rope init function for ``layer_type``, or None when it is not a known one."""
    rope_type = getattr(module, "rope_type", None)
    if isinstance(rope_type, dict):
        rope_type = rope_type.get(layer_type)
    if not isinstance(rope_type, str) or rope_type in STATIC_ROPE_TYPES_EXCLUDED:
        return None
    fn = getattr(module, "rope_init_fn", None)
    if callable(fn):
        return fn
    if rope_type == "default" and callable(getattr(module, "compute_default_rope_parameters", None)):
        return module.compute_default_rope_parameters
    table = getattr(sys.modules.get(type(module).__module__), "ROPE_INIT_FUNCTIONS", None)
    return table.get(rope_type) if isinstance(table, dict) else None


def _recomputed(module: nn.Module, layer_type: str | None, dtype: torch.dtype, device: Any) -> torch.Tensor | None:
    fn = _init_fn(module, layer_type)
    if fn is None:
        return None
    kwargs = {"layer_type": layer_type} if layer_type is not None else {}
    try:
        if dtype == torch.float64:
            with _Widened():
                out = fn(module.config, device="cpu", **kwargs)
        else:
            out = fn(module.config, device="cpu", **kwargs)
    except Exception:  # noqa: BLE001 -- an init function we cannot call: the plain upcast stays
        return None
    table = out[0] if isinstance(out, tuple) else out
    if not isinstance(table, torch.Tensor) or not table.is_floating_point():
        return None
    return table.to(device=device, dtype=dtype)


def _agrees(stored: torch.Tensor, table: torch.Tensor) -> bool:
    """The recomputed table is the stored one up to half-precision rounding (2^-6 relative: a table
    rounded through bfloat16, then maybe upcast again, still counts as the definition's; another
    rope type or theta differs by far more)."""
    if stored.shape != table.shape:
        return False
    ref = table.to(torch.float64)
    return bool(((stored.to(torch.float64) - ref).abs() <= _AGREE_RTOL * ref.abs() + 1e-30).all())


def rotary_tables(model: nn.Module, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """``{id(buffer): table}``: every rotary table of a known module of ``model`` recomputed in
    ``dtype`` from the module's definition (see the module docstring), where it differs from the
    stored buffer (a stored table already equal bit for bit is left out). Empty for half-precision
    ``dtype`` (half arithmetic is an explicit choice: its tables stay as stored). Nothing is written."""
    if dtype in (torch.float16, torch.bfloat16):
        return {}
    out: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if getattr(module, "config", None) is None:
            continue
        cache: dict[str | None, torch.Tensor | None] = {}
        for name, buf in module._buffers.items():
            if buf is None or not name.endswith(_SUFFIX) or not buf.is_floating_point():
                continue
            layer_type = _layer_type(name)
            if layer_type not in cache:
                cache[layer_type] = _recomputed(module, layer_type, dtype, buf.device)
            table = cache[layer_type]
            if table is None or not _agrees(buf, table):
                continue
            if buf.dtype == dtype and torch.equal(buf, table):
                continue
            out[id(buf)] = table.clone()
    return out


def write_rotary_tables(model: nn.Module, dtype: torch.dtype) -> int:
    """Write :func:`rotary_tables` into ``model``'s buffers (``.data`` replaced; for a model that is
    itself cast to its compute dtype, as the FSDP2 path shards it: the same tables the one-process
    policy swaps in for each call). Returns how many tables were written."""
    tables = rotary_tables(model, dtype)
    written = 0
    for buf in model.buffers():
        if id(buf) in tables:
            buf.data = tables[id(buf)]
            written += 1
    return written

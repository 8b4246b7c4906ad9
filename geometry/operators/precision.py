"""The compute precision of curvature, separate from the dtype the weights are stored in (docs/science.md §4).

A half-precision checkpoint (bfloat16, float16) stores its weights in 16 bits; its Hessian computed
in 16-bit arithmetic is off by percents (bfloat16 gradient differences: 35–39% on random-init
Qwen2 / Mistral shapes; the exact reverse backend in bfloat16: 2%; issue #35). So by default the
curvature of a half-precision model is computed in **float32 arithmetic**: for each product call
every floating parameter and buffer stored in another dtype holds a float32 copy (``.data``
swapped; rotary tables such as ``inv_freq`` recomputed from their definition in float32:
:mod:`losslens.geometry.operators.rotary`), and the stored half tensors come back after the call
untouched — they are never written, so they stay the exact restore source. The Hessian is then
that of the loss of the same half weights (a bfloat16 number converts to float32 exactly), computed
in float32.

``compute_dtype="bfloat16"`` (or ``float16``) keeps half-precision arithmetic as an explicit
choice for speed or memory; its measured error is recorded and shown. ``float64`` is for
references.

Memory: the compute copy of every floating tensor stored in another dtype
(:func:`compute_copy_bytes`: 4 bytes per parameter for a half model in float32, on top of the
2 bytes it already holds), alive during each product call and counted in every pass of the
memory plan. Gradient graphs are not kept between calls then (``cache_graphs`` is off): swapping
a parameter's ``.data`` to another dtype gives it a new gradient accumulator, so a graph built in
one call would not reach the parameters in the next (measured: products of zero); each call
rebuilds its graphs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from losslens.geometry.operators.interface import OperatorError
from losslens.geometry.operators.rotary import rotary_tables

__all__ = ["COMPUTE_DTYPES", "HALF_DTYPES", "compute_dtype_for", "compute_copy_bytes", "computed_in", "cast_inputs"]

#: The compute dtypes by name (the CLI's ``--compute-dtype`` choices).
COMPUTE_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
#: Storage dtypes whose curvature is computed in float32 by default.
HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype_for(storage: torch.dtype, requested: Any = None) -> torch.dtype:
    """The dtype products run in for weights stored in ``storage``: ``requested`` (a dtype or one of
    :data:`COMPUTE_DTYPES`' names) when given, else float32 for half precision and ``storage`` itself
    otherwise. Raises :class:`OperatorError` for anything but a floating dtype."""
    if requested is None:
        return torch.float32 if storage in HALF_DTYPES else storage
    dtype = COMPUTE_DTYPES.get(requested) if isinstance(requested, str) else requested
    if dtype not in COMPUTE_DTYPES.values():
        raise OperatorError(
            f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)} (or None: float32 for "
            f"half-precision weights), got {requested!r}"
        )
    return dtype


def _tensors(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, bool]]:
    """``(module, name, tensor, is_parameter)`` of every floating parameter and buffer, each once."""
    out, seen = [], set()
    for module in model.modules():
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is None or not t.is_floating_point() or id(t) in seen:
                continue
            seen.add(id(t))
            out.append((module, name, t, name in module._parameters))
    return out


def cast_inputs(batch: Any, dtype: torch.dtype) -> Any:
    """``batch`` with its half-precision floating tensors (a tensor, or a tuple/list of them) cast to
    ``dtype`` when that is wider, so float32 compute of a half model also takes half inputs (token ids
    and other tensors pass unchanged; anything else is returned as it is)."""

    def cast(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dtype in HALF_DTYPES and t.dtype != dtype and dtype not in HALF_DTYPES:
            return t.to(dtype)
        return t

    if isinstance(batch, (tuple, list)):
        return type(batch)(cast(t) for t in batch)
    return cast(batch)


def compute_copy_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of the ``dtype`` copies :func:`computed_in` makes: every floating parameter and buffer of
    ``model`` stored in another dtype (0 when all are already ``dtype``)."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * size for _, _, t, _ in _tensors(model) if t.dtype != dtype)


@contextlib.contextmanager
def computed_in(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within the block every floating parameter and buffer of ``model`` stored in another dtype holds
    a ``dtype`` copy (``.data`` swapped; the Parameter objects stay the same), and every rotary table
    of a known rotary embedding holds its definition recomputed in ``dtype``
    (:func:`~losslens.geometry.operators.rotary.rotary_tables`: a bfloat16-rounded ``inv_freq`` would
    otherwise put attention on bf16-rounded positions; float32 and float64 only); the stored tensors
    are put back afterwards, never written; the copies are freed."""
    swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
    tables = rotary_tables(model, dtype)
    try:
        for _module, _name, t, _is_param in _tensors(model):
            if t.dtype == dtype and id(t) not in tables:
                continue
            stored = t.data
            t.data = tables[id(t)] if id(t) in tables else stored.to(dtype)
            swapped.append((t, stored))
        yield
    finally:
        for t, stored in swapped:
            t.data = stored

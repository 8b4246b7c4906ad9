"""Naming the op at fault when a second-order check fails.

Helpers of :func:`losslens.lm.models.second_order.check_second_order`: op names pulled out of
autograd / functorch error messages, the custom ``autograd.Function`` s in a loss graph with the
module that produced each (the usual culprits of a missing or non-differentiable backward), and
the parameters with the largest mismatch.
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from losslens.geometry.operators.attention import second_order_attention


_OP_PATTERNS = (
    re.compile(r"vmap over (\w+)"),
    re.compile(r"forward AD with (\S+)"),
    re.compile(r"derivative for (\S+) is not implemented"),
    re.compile(r"(aten::\w+(?:\.\w+)?)"),
    re.compile(r"function (\w+Backward\d*) returned"),
    re.compile(r"\b(\w+Backward\d*)\b"),
)


def ops_in(message: str) -> tuple[str, ...]:
    found: list[str] = []
    for pat in _OP_PATTERNS:
        for m in pat.findall(message):
            m = m.strip("'\".,:;")
            if m and m not in found:
                found.append(m)
    return tuple(found)


def _is_custom(fn) -> bool:
    return fn is not None and (hasattr(fn, "_forward_cls") or type(fn).__name__ == "BackwardCFunction")


def custom_functions(model: nn.Module, loss_fn: Callable, batch) -> tuple[str, ...]:
    """Custom autograd Functions in the loss graph, with the module whose output they produced."""
    producers: dict[int, str] = {}
    handles = []

    def make(name: str, mod: nn.Module):
        def hook(_m, _args, out):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for t in outs:
                if isinstance(t, torch.Tensor) and _is_custom(t.grad_fn):
                    producers.setdefault(id(t.grad_fn), f"{name or '<model>'} ({type(mod).__name__})")

        return hook

    for name, mod in model.named_modules():
        handles.append(mod.register_forward_hook(make(name, mod)))
    try:
        with torch.enable_grad(), second_order_attention():
            loss = loss_fn(model, batch)
            seen: set[int] = set()
            stack = [loss.grad_fn]
            found: list[str] = []
            while stack:
                fn = stack.pop()
                if fn is None or id(fn) in seen:
                    continue
                seen.add(id(fn))
                if _is_custom(fn):
                    cls = getattr(fn, "_forward_cls", None)
                    label = cls.__name__ if cls is not None else type(fn).__name__
                    where = producers.get(id(fn), "inside a module (not its direct output)")
                    found.append(f"{where}: {label}")
                stack.extend(nxt for nxt, _ in fn.next_functions)
    finally:
        for h in handles:
            h.remove()
    return tuple(sorted(set(found)))


def worst_params(space, HV: torch.Tensor, ref: torch.Tensor, n: int = 3) -> tuple[tuple[str, float], ...]:
    errs = []
    for name, sl in space.slices.items():
        den = float(torch.linalg.vector_norm(ref[:, sl].double())) + 1e-30
        errs.append((name, float(torch.linalg.vector_norm((HV[:, sl] - ref[:, sl]).double())) / den))
    errs.sort(key=lambda t: -t[1])
    return tuple((nm, round(e, 6)) for nm, e in errs[:n])


def format_exc(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]

"""Piecewise activations frozen on their branch at θ, for gradient-difference products.

A piecewise activation (ReLU, LeakyReLU, Hardtanh/ReLU6, ReLU², HF's xIELU) is smooth on each
piece, and the Hessian that double backward computes at θ is that of the network whose every
activation keeps the piece its input is on *at θ* (a kink has measure zero). Gradient differences
evaluate θ ± εv, where some inputs have crossed a kink: ReLU's gradient jumps there (an error that
does not vanish as ε → 0), xIELU's second derivative does (an O(ε) error, 2–8e-3 in float32 on tiny
Apertus models). :class:`FrozenBranches` removes both: one forward at θ per batch records which
piece each input of each such module is on (a bool mask), and the forwards at θ ± εv evaluate each
module's recorded piece at the perturbed input (a forward hook replaces the output). The function
differenced is then smooth along the path and has the same Hessian at θ, so the error is O(ε²).

Covered: ``nn.ReLU``, ``nn.LeakyReLU``, ``nn.Hardtanh`` and ``nn.ReLU6``, HF ``ReLUSquaredActivation``
and ``XIELUActivation`` (its pieces ``αp·x² + βx`` and ``αn·(eˣ − 1 − x) + βx``). A module called
more than once per forward is left as it is (its calls cannot be told apart), as are activations
applied as plain functions. Memory: one byte per input element of every covered module per
curvature batch (two for Hardtanh), held for one product call (``mask_bytes``). Cost: one forward
per batch per call.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn

__all__ = ["FrozenBranches", "frozen_classes"]


def _xielu(module: nn.Module, x: torch.Tensor, masks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    alpha_p = nn.functional.softplus(module.alpha_p)
    alpha_n = module.beta + nn.functional.softplus(module.alpha_n)
    positive = alpha_p * x * x + module.beta * x
    negative = (torch.expm1(x) - x) * alpha_n + module.beta * x
    return torch.where(masks[0], positive, negative)


def _hardtanh(module: nn.Module, x: torch.Tensor, masks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    low, high = masks
    return torch.where(
        low, torch.full_like(x, module.min_val), torch.where(high, torch.full_like(x, module.max_val), x)
    )


#: class name -> (masks of an input at θ, the frozen pieces evaluated at a perturbed input)
_RULES: dict[str, tuple[Callable[[nn.Module, torch.Tensor], tuple], Callable[..., torch.Tensor]]] = {
    "ReLU": (lambda m, x: (x > 0,), lambda m, x, k: x * k[0]),
    "LeakyReLU": (lambda m, x: (x > 0,), lambda m, x, k: torch.where(k[0], x, m.negative_slope * x)),
    "ReLUSquaredActivation": (lambda m, x: (x > 0,), lambda m, x, k: torch.square(x * k[0])),
    "XIELUActivation": (lambda m, x: (x > 0,), _xielu),
    "Hardtanh": (lambda m, x: (x < m.min_val, x > m.max_val), _hardtanh),
    "ReLU6": (lambda m, x: (x < m.min_val, x > m.max_val), _hardtanh),
}


def frozen_classes() -> tuple[str, ...]:
    """The activation class names :class:`FrozenBranches` freezes."""
    return tuple(_RULES)


def _rule(module: nn.Module):
    name = type(module).__name__
    if name == "XIELUActivation" or type(module).__module__.startswith(("torch.nn", "transformers")):
        return _RULES.get(name)
    return None


class FrozenBranches:
    """Record each covered module's branch masks at θ per batch, replay them at θ ± εv (module
    docstring). Use: ``with branches.active(): branches.record(i, forward); with branches.replay(i): ...``."""

    def __init__(self, model: nn.Module):
        self.modules = [m for m in model.modules() if _rule(m) is not None]
        self.masks: dict[int, dict[int, tuple | None]] = {}
        self._mode: str | None = None
        self._index: int | None = None

    def __bool__(self) -> bool:
        return bool(self.modules)

    @property
    def mask_bytes(self) -> int:
        """Bytes of the masks held (one per element)."""
        return sum(t.numel() for per in self.masks.values() for ms in per.values() if ms for t in ms)

    @contextlib.contextmanager
    def active(self) -> Iterator["FrozenBranches"]:
        """Hooks on the covered modules for the block; the masks are dropped on exit."""
        handles = [m.register_forward_hook(self._hook) for m in self.modules]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self.masks.clear()
            self._mode = self._index = None

    def record(self, index: int, forward: Callable[[], Any]) -> None:
        """Run ``forward()`` (at θ, no graph needed) and keep the masks of batch ``index``."""
        self.masks[index] = {}
        self._mode, self._index = "record", index
        try:
            with torch.no_grad():
                forward()
        finally:
            self._mode = self._index = None

    def record_all(self, items, forward: Callable[[Any, int], Any]):
        """:meth:`record` every ``(index, weight, batch)`` of ``items`` with ``forward(batch, index)``;
        returns :meth:`replay` for the products, or None when the model has no covered module."""
        if not self:
            return None
        for index, _, batch in items:
            self.record(index, lambda: forward(batch, index))
        return self.replay

    @contextlib.contextmanager
    def replay(self, index: int) -> Iterator[None]:
        """Forwards in the block evaluate the pieces recorded for batch ``index``."""
        self._mode, self._index = "replay", index
        try:
            yield
        finally:
            self._mode = self._index = None

    def _hook(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if self._mode is None or not args or not isinstance(args[0], torch.Tensor):
            return None
        x = args[0]
        masks_of, frozen = _rule(module)
        store = self.masks.setdefault(self._index, {})
        if self._mode == "record":
            store[id(module)] = None if id(module) in store else masks_of(module, x.detach())
            return None
        masks = store.get(id(module))
        if masks is None or masks[0].shape != x.shape or not isinstance(output, torch.Tensor):
            return None
        return frozen(module, x, masks).to(output.dtype)

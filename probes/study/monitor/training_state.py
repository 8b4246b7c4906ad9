"""Leave training exactly as it was: :func:`preserved` saves and restores everything a measurement
could disturb.

Saved on entry and written back on exit (also on an exception):

* the random number generators: Python's ``random``, NumPy's global state, torch's CPU generator
  and, when CUDA is initialised, every CUDA device's generator -- so dropout masks, data shuffling
  and sampling after the measurement draw the same numbers as without it;
* every module's own ``training`` flag (:func:`losslens.geometry.base.modes.module_modes`; the block runs in
  eval mode);
* every parameter's ``requires_grad`` flag and ``.grad``: the same tensor object is put back, and
  its values too (a copy is compared and restored, in case anything wrote into it in place).

The optimizer is never touched (the monitor holds no reference to it). Cost: one copy of the
gradients that exist (none right after ``zero_grad(set_to_none=True)``), one pass over the modules.
"""

from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch
from torch import nn

from losslens.geometry.base.modes import module_modes

__all__ = ["preserved", "rng_states", "set_rng_states"]


def rng_states() -> dict:
    """The states of Python's, NumPy's, torch's CPU and (if initialised) every CUDA generator."""
    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_states(states: dict) -> None:
    """Write back what :func:`rng_states` returned."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[nn.Module]:
    """The block runs with ``model`` in eval mode; on exit every RNG state, module mode,
    ``requires_grad`` flag and ``.grad`` (object and values) is as it was on entry."""
    states = rng_states()
    params = list(model.parameters())
    saved = [(p, p.requires_grad, p.grad, None if p.grad is None else p.grad.detach().clone()) for p in params]
    try:
        with module_modes(model, training=False):
            yield model
    finally:
        for p, req, g, copy in saved:
            if p.requires_grad != req:
                p.requires_grad_(req)
            if p.grad is not g:
                p.grad = g
            if g is not None and not torch.equal(g, copy):
                with torch.no_grad():
                    g.copy_(copy)
        set_rng_states(states)

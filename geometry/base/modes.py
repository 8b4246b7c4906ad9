"""Train/eval mode of a model for the length of a block, every module's own mode restored after.

``model.train(was_training)`` after an evaluation flattens a model whose submodules were in
different modes (a frozen backbone in eval under a head in train, MC-dropout layers left in
train): every module ends in the top module's mode. :func:`module_modes` records each module's
``training`` flag and writes it back one by one (without the recursion of ``nn.Module.train``).
Every place that switches a user's model to eval for a while uses it: surfaces
(:func:`losslens.geometry.surfaces.surface.evaluate_surface`), ``losslens.lm.core.next_token_loss.evaluate`` and the
GPTQ and AWQ drivers;
:class:`losslens.geometry.operators.hessian.HessianOperator` restores per-module modes the same way.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


@contextlib.contextmanager
def module_modes(model: nn.Module, training: bool = False) -> Iterator[nn.Module]:
    """Every module of ``model`` in train (``training=True``) or eval mode inside the block; on exit
    (also on an exception) each module gets back its own previous ``training`` flag.

    Cost: one pass over ``model.modules()`` on entry and one on exit; no tensor is touched.
    Modules added to the model inside the block keep whatever mode they have.
    """
    saved = [(m, m.training) for m in model.modules()]
    model.train(bool(training))
    try:
        yield model
    finally:
        for m, flag in saved:
            m.training = flag


__all__ = ["module_modes"]

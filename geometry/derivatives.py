"""Make autograd return the derivatives of the function the forward computes.

``nn.Embedding(padding_idx=p)`` (and ``nn.EmbeddingBag``) compute ``weight[p]`` in the forward like
any other row, but their backward zeroes the gradient of row p by convention (the padding row is
not trained). Whenever token p occurs in a batch, autograd's "gradient" G = P·∇L (P zeroes row p)
is then not the derivative of the loss, and its Jacobian P·H is not symmetric: reverse-over-reverse
returns H·P·v, forward-over-reverse P·H·v, and neither is the Hessian H·v of the loss (measured on
the tiny OLMo, OLMo-2, SmolLM3 and Apertus models, whose ``pad_token_id`` is a real vocabulary
row: 3–1,300× relative disagreement between the two backends, issue #12). The padding convention
is a training rule, not part of the function, so curvature code runs under
:func:`true_derivatives`, which clears ``padding_idx`` for the call (the forward is unchanged) and
restores it afterwards. ``F.embedding(..., padding_idx=...)`` called directly inside a custom module
cannot be reached this way; :func:`probes.families.check_second_order` catches such ops by
comparing both backends on a probe batch that contains every special token.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

__all__ = ["true_derivatives", "padding_modules"]


def padding_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every ``nn.Embedding`` / ``nn.EmbeddingBag`` with a ``padding_idx``."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.padding_idx is not None]


@contextlib.contextmanager
def true_derivatives(model: nn.Module) -> Iterator[None]:
    """Within the block, embeddings have no ``padding_idx``, so autograd differentiates the
    forward exactly; the previous values are restored on exit (also on error)."""
    saved = [(m, m.padding_idx) for _, m in padding_modules(model)]
    for m, _ in saved:
        m.padding_idx = None
    try:
        yield
    finally:
        for m, idx in saved:
            m.padding_idx = idx

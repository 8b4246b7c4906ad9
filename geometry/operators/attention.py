"""Attention in a mode that has second-order and forward-mode AD rules.

PyTorch's fused SDPA kernels (flash, memory-efficient, the fused CPU kernel) implement no double
backward and no forward-AD rule. Curvature code therefore runs every forward pass inside
:func:`second_order_attention`, which restricts ``scaled_dot_product_attention`` to the MATH
backend (a composition of matmul/softmax ops that differentiates to any order). Models that use
eager attention are unaffected. Callers never need to know: the HVP operators enter it themselves.
"""

from __future__ import annotations

import contextlib

from torch.nn.attention import SDPBackend, sdpa_kernel


@contextlib.contextmanager
def second_order_attention():
    """Context in which SDPA uses only the MATH backend (twice differentiable, forward-AD capable)."""
    with sdpa_kernel(SDPBackend.MATH):
        yield

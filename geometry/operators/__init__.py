"""geometry.operators: curvature operators; imports ``geometry.base`` and ``geometry.memory``.

- ``interface``: :class:`CurvatureOperator` (``matvec``, batched ``matmat``, scipy ``LinearOperator``)
  and :class:`OperatorError`;
- ``hessian``: :class:`HessianOperator`, batched HVPs of a loss over batches (reverse-over-reverse
  by default); ``_forward``: its forward-over-reverse backend (torch.func); ``difference``: its
  gradient-difference backend (first order only: ``loss.backward()`` at θ ± εv, θ restored bit-exactly);
- ``dense``: :class:`DenseOperator` and ``exact_hessian`` (row by row with double backward);
- ``fingerprint``: when kept gradient graphs are still valid (identity, version, content checksum);
- ``derivatives``: true derivatives (``padding_idx`` cleared) and the dead-row check;
- ``attention``: attention in the MATH SDPA kernel for second-order passes;
- ``linear_ce``: the lean linear + softmax cross-entropy head (closed-form derivatives).

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

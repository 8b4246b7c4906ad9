"""losslens.geometry.operators: curvature operators; imports ``losslens.geometry.base`` and
``losslens.geometry.memory``.

- ``interface``: :class:`CurvatureOperator` (``matvec``, batched ``matmat``, scipy ``LinearOperator``)
  and :class:`OperatorError`;
- ``hessian``: :class:`HessianOperator`, batched HVPs of a loss over batches; ``call``: the
  conventions of every product call (modes, attention, frozen parameters, restored state);
- ``backend``: the product-backend interface (:class:`ProductBackend`) and the vector spaces of the
  difference loop; ``names``: the name → backend map (the one place a backend's name is read); the
  backends: ``reverse`` (reverse-over-reverse, the
  default), ``forward`` (forward-over-reverse, torch.func), ``difference`` (gradient differences:
  first order only, θ restored bit-exactly, its error measured by ``product_check``); ``auto``: the
  choice between them; ``precision``: the compute dtype of a half-precision model (float32 by
  default); ``param_dicts``: products of per-parameter blocks; ``first_order``: the loss and its
  gradient; ``setup_plan``: the set-up's memory, planned before anything is measured;
- ``data_parallel``: products over ranks that each hold the whole model (``DataParallel``);
  ``sharded``: :class:`ShardedHessianOperator`, FSDP2-sharded models (the difference loop on shards);
- ``dense``: :class:`DenseOperator` and ``exact_hessian`` (row by row with double backward);
- ``fingerprint``: when kept gradient graphs are still valid (identity, version, content checksum);
- ``derivatives``: true derivatives (``padding_idx`` cleared) and the dead-row check;
- ``attention``: attention in the MATH SDPA kernel for second-order passes;
- ``linear_ce``: the lean linear + softmax cross-entropy head (closed-form derivatives);
- ``guarantees``: what an operator says before its first product leaves (``ProductErrorWarning`` over
  its tolerance, ``ZeroEmbeddingWarning`` for zero-embedding tokens its loss counts).

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

"""geometry.estimators: numbers computed from Hessian-vector products; imports ``geometry.base``,
``geometry.memory`` and ``geometry.operators``.

- ``trace``: Hutchinson, Hutch++ and per-block traces;
- ``eigen``: top eigenvalues by power iteration and Lanczos; ``_lanczos``: the Lanczos recurrence;
- ``density``: spectral density by stochastic Lanczos quadrature;
- ``directional``: curvature along one direction;
- ``attribution``: a loss change split by factor and by block;
- ``_checks``: the estimators' shared argument checks.

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

"""losslens.geometry.estimators: numbers computed from Hessian-vector products; imports ``losslens.geometry.base``,
``losslens.geometry.memory`` and ``losslens.geometry.operators``.

- ``trace``: Hutchinson and Hutch++ traces and their memory plan; ``blocks``: per-block traces;
- ``sampling``: Rademacher probes, their Student-t statistics, the memory plan of probes in blocks;
- ``eigen``: top eigenvalues and their memory plan; ``_eigen_solvers``: thick-restart Lanczos and
  deflated power iteration; ``_lanczos``: the Lanczos recurrence of the spectral density;
- ``density``: spectral density by stochastic Lanczos quadrature;
- ``directional``: curvature along one direction;
- ``attribution``: a loss change split by factor and by block;
- ``_checks``: the estimators' shared argument checks.

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

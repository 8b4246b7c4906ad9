"""geometry.surfaces: loss surfaces; imports ``geometry.base`` and ``geometry.memory``, no operator
and no estimator.

- ``planes``: planes through three points, lines, the :class:`Plane` / :class:`Line` data;
- ``random_planes``: random filter-normalised planes (Li et al. 2018);
- ``grid``: grid specifications;
- ``moving``: moving a model's parameters over a plane (batched over grid points);
- ``surface``: :func:`evaluate_surface`, :func:`evaluate_line` and the :class:`Surface` result.

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

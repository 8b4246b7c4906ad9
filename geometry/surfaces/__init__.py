"""geometry.surfaces: loss surfaces; imports ``geometry.base`` and ``geometry.memory``, no operator
and no estimator.

- ``planes``: planes through three points, random filter-normalised planes, lines;
- ``grid``: grid specifications;
- ``moving``: moving a model's parameters over a plane (batched over grid points);
- ``surface``: :func:`evaluate_surface`, :func:`evaluate_line` and the :class:`Surface` result.

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

"""losslens.geometry.surfaces: loss surfaces; imports ``losslens.geometry.base`` and ``losslens.geometry.memory``, no
operator
and no estimator.

- ``planes``: the :class:`Plane` / :class:`Line` data, their memory plan and orthonormality check;
- ``point_planes``: the plane through three points and the line through a point;
- ``random_planes``: random filter-normalised planes (Li et al. 2018);
- ``grid``: grid specifications and the axes of a ``grid`` argument;
- ``moving``: moving a model's parameters over a plane (batched over grid points);
- ``surface``: :func:`evaluate_surface`, :func:`evaluate_line` and the :class:`Surface` result;
- ``resume``: the fingerprint and row file that make a surface evaluation resumable;
- ``sources``: points of parameter space read a slice at a time;
- ``trajectory_pca``: the principal axes of N checkpoints; ``trajectory_axes``: those axes as data
  (:class:`~losslens.geometry.surfaces.trajectory_axes.TrajectoryPCA`) and points projected onto them.

This ``__init__`` imports nothing: import the module you need, or the public names from ``geometry``.
"""

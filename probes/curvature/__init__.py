"""Curvature of one checkpoint, measured once (what ``losslens sharpness`` prints).

- :mod:`.sharpness` -- :func:`~.sharpness.sharpness`: the Hessian trace with its interval and the top
  eigenvalues of one checkpoint (folder, file or hub name), :class:`~.sharpness.SharpnessError`;
- :mod:`.methods`   -- the estimator names a caller may ask for (:data:`~.methods.TRACE_METHODS`,
  :data:`~.methods.EIGEN_METHODS`).

A sweep measures the same numbers along a trajectory with its ``trace`` and ``eigen`` probes
(:mod:`probes.sweep_probes`). The room imports nothing at package level: ``from probes.curvature
import sharpness`` is the module.
"""

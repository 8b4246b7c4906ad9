"""A run's own landscape: principal planes through whole trajectories, quantized points on them.

Modules: ``sources`` (checkpoints read a tensor slice at a time, as point sources),
``landscape`` (:func:`~probes.landscape.landscape.trajectory_landscape`, :class:`~probes.landscape.landscape.Landscape`).
"""

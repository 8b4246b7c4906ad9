"""A run's own landscape: principal planes through whole trajectories, quantized points on them.

- :mod:`.sources` -- checkpoints read a tensor slice at a time as point sources
  (:func:`~.sources.checkpoint_source`, :class:`~.sources.CheckpointSource`);
- :mod:`.trajectory_landscape` -- :func:`~.trajectory_landscape.trajectory_landscape` (PCA of the
  checkpoints, quantized points projected with their residuals, the loss over the plane) and
  :class:`~.trajectory_landscape.Landscape`.

The figure is :func:`losslens.study.report.landscape_figures.landscape_figure`. The room imports nothing
at package level.
"""

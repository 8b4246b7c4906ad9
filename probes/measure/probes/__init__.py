"""The probes a sweep runs on each checkpoint, one module each, and their registry.

- :mod:`.registry`    -- :data:`~.registry.REGISTRY`: every probe, in execution order (one line each);
- :mod:`.probe`       -- :class:`~.probe.Probe`: what a probe declares (settings, tasks, run, series, figure);
- one module per probe: :mod:`.loss`, :mod:`.kurtosis`, :mod:`.quant`, :mod:`.directional`,
  :mod:`.trace`, :mod:`.eigen`, :mod:`.block_trace`, :mod:`.explain`, :mod:`.accuracy`;
- what they share: :mod:`.tasks` (:class:`~.tasks.Task`, the config hash), :mod:`.rows`
  (:class:`~.rows.ProbeRow`, :func:`~.rows.metric`), :mod:`.state` (:class:`~.state.CheckpointState`:
  one loaded checkpoint, the FP loss and Hessian operator its probes share), :mod:`.validation`
  (:class:`~.validation.PlanError` and the settings checks).

The room imports nothing at package level; :mod:`losslens.study.sweep.plan` builds the :class:`Plan` from
the registry.
"""

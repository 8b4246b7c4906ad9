"""``losslens demo``: the whole study on the embedded trajectories, as a library.

- :mod:`.demo_settings` -- :class:`DemoOptions` (the command's options), :class:`DemoSettings` (the study:
  :data:`DEFAULT`, :data:`QUICK`), :class:`DemoError`;
- :mod:`.demo_jobs`     -- the heavy work (training with the monitor, the planes, the landscape);
- :mod:`.demo_study`    -- :func:`run_demo`: every stage, resumable, and its :class:`DemoResult`.
"""

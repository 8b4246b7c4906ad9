"""Training tiny trajectories here: the embedded default trajectory, grids of runs, schedule forks.

- :mod:`.config`       -- :class:`TrainConfig` (everything that determines a run) and :func:`lr_at`;
- :mod:`.schedules`    -- the LR schedules as pure functions (WSD, cosine, linear, SGDR, oscillating);
- :mod:`.tiny_data`    -- :func:`prepare_data` (cached tokenizer, token streams, validation set), :func:`get_batch`;
- :mod:`.run_files`    -- :func:`save_checkpoint` (an HF checkpoint folder), :func:`write_json` (atomic);
- :mod:`.tiny`         -- :func:`train_tiny`: a nanoGPT-style loop writing HF checkpoints + trajectory.json;
- :mod:`.grid`         -- :func:`train_sweep`: the cartesian product of config values, one folder per run;
- :mod:`.fork_schedule` -- :class:`ForkSchedule` (a fork's LR schedule) and :func:`lr_function` (any run's LR);
- :mod:`.forks`        -- :func:`fork_trajectory`: continue a checkpoint under a new schedule, exactly;
- :mod:`.fork_compare` -- :func:`compare_forks`: the forks' quantization gaps and wins per seed pair;
- :mod:`.train_settings` -- :class:`TrainSettings` and :func:`train_runs` (``losslens train-tiny``'s runs);
- :mod:`.fork_settings` -- :class:`ForkSettings`, :class:`CompareSettings` and :func:`fork_runs`,
  :func:`compare_fork_runs` (``losslens fork`` / ``compare-forks``).
"""

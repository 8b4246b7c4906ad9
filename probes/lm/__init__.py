"""losslens.lm: the language-model plumbing every measurement stands on.

- :mod:`losslens.lm.core` -- the LM loss and its evaluation, token sets, module selection, numerics,
  thread counts, worker processes, process groups, base LR schedules;
- :mod:`losslens.lm.checkpoints` -- trajectories of checkpoints (folders, files, hub names, GGUF),
  loading, schedules, LAWA;
- :mod:`losslens.lm.data` -- text sources, tokenizers and the evaluation / calibration / curvature
  token sets;
- :mod:`losslens.lm.models` -- model families, the curvature operator of an LM with its checks
  (``lm_hessian``), FSDP2 sharding, weight statistics;
- :mod:`losslens.lm.quant` -- every quantizer behind ``quantize(model, spec)`` and the
  quantization error;
- :mod:`losslens.lm.train` -- tiny training runs, LR schedules and schedule forks.

The room imports nothing at package level.
"""

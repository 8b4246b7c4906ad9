"""losslens: loss geometry of language-model training trajectories.

The front door: the commands as functions with the CLI's options as keyword parameters (same names,
defaults and results: ``losslens.sharpness(ckpt, quick=True, seed=1)`` returns what
``losslens sharpness ckpt --quick --seed 1 --json`` prints), and the objects a notebook needs::

    import losslens
    res = losslens.sharpness("runs/tiny", quick=True, max_memory="2GB")
    rows = losslens.quantize("runs/tiny", spec=["rtn:4:g128"], quick=True)
    traj = losslens.open_trajectory("hf:EleutherAI/pythia-70m@step*")

Importing the package is light: a name is imported from its module when first used (PEP 562), and
the command functions' modules import torch only when called. Warnings about a result (a measured
product error over its tolerance, ...) are :class:`LosslensWarning`\\ s; errors a user can fix are
:class:`LosslensError`\\ s.
"""

from __future__ import annotations

from losslens.geometry.base.lazy import lazy_exports

_WHERE = {  # public name -> the module defining it under that name (imported on first use)
    # the commands (losslens COMMAND ... --json)
    "sharpness": "losslens.measure.sharpness",
    "quantize": "losslens.measure.checkpoint_quantization",
    "explain": "losslens.measure.checkpoint_explanation",
    "sweep": "losslens.study.trajectory_sweep",
    "report": "losslens.study.report.store_report",
    "accuracy": "losslens.measure.accuracy.checkpoint_accuracy",
    "landscape": "losslens.study.landscape.trajectory_landscapes",
    "surface": "losslens.measure.checkpoint_surface",
    # trajectories, checkpoints and data
    "Trajectory": "losslens.lm.checkpoints.trajectory",
    "open_trajectory": "losslens.lm.checkpoints.locate",
    "open_checkpoint": "losslens.lm.checkpoints.locate",
    "CheckpointLoader": "losslens.lm.checkpoints.loader",
    "default_token_sets": "losslens.lm.data.token_sets",
    "TokenSet": "losslens.lm.core.tokenset",
    # the loss, its curvature operator and the estimators
    "lm_loss": "losslens.lm.core.next_token_loss",
    "lm_hessian": "losslens.lm.models.curvature",
    "HessianOperator": "losslens.geometry.operators.hessian",
    "hutchpp_trace": "losslens.geometry.estimators.trace",
    "hutchinson_trace": "losslens.geometry.estimators.trace",
    "top_eigenvalues": "losslens.geometry.estimators.eigen",
    "spectral_density": "losslens.geometry.estimators.density",
    "quantization_error": "losslens.lm.quant.metrics",
    # sweeps: the plan, the store, the runner, the summary table
    "Plan": "losslens.study.sweep.plan",
    "Store": "losslens.study.sweep.store",
    "run_sweep": "losslens.study.sweep.executor",
    "summary": "losslens.study.analysis.summary",
    # errors and warnings
    "LosslensError": "losslens.geometry.base.errors",
    "LosslensWarning": "losslens.geometry.base.errors",
}

__all__ = list(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _WHERE)

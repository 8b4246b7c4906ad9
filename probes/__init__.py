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

import importlib

_WHERE = {  # public name -> "module:attribute" (imported on first use)
    # the commands (losslens COMMAND ... --json)
    "sharpness": "losslens.measure.sharpness:sharpness",
    "quantize": "losslens.measure.checkpoint_quantization:quantize",
    "explain": "losslens.measure.checkpoint_explanation:explain",
    "sweep": "losslens.study.trajectory_sweep:sweep",
    "report": "losslens.study.report.store_report:report",
    "accuracy": "losslens.measure.accuracy.checkpoint_accuracy:accuracy",
    "landscape": "losslens.study.landscape.trajectory_landscapes:landscape",
    "surface": "losslens.measure.checkpoint_surface:surface",
    # trajectories, checkpoints and data
    "Trajectory": "losslens.lm.checkpoints.trajectory:Trajectory",
    "open_trajectory": "losslens.lm.checkpoints.locate:open_trajectory",
    "open_checkpoint": "losslens.lm.checkpoints.locate:open_checkpoint",
    "CheckpointLoader": "losslens.lm.checkpoints.loader:CheckpointLoader",
    "default_token_sets": "losslens.lm.data.token_sets:default_token_sets",
    "TokenSet": "losslens.lm.core.tokenset:TokenSet",
    # the loss, its curvature operator and the estimators
    "lm_loss": "losslens.lm.core.next_token_loss:lm_loss",
    "lm_hessian": "losslens.lm.models.curvature:lm_hessian",
    "HessianOperator": "losslens.geometry.operators.hessian:HessianOperator",
    "hutchpp_trace": "losslens.geometry.estimators.trace:hutchpp_trace",
    "hutchinson_trace": "losslens.geometry.estimators.trace:hutchinson_trace",
    "top_eigenvalues": "losslens.geometry.estimators.eigen:top_eigenvalues",
    "spectral_density": "losslens.geometry.estimators.density:spectral_density",
    "quantization_error": "losslens.lm.quant.metrics:quantization_error",
    # sweeps: the plan, the store, the runner, the summary table
    "Plan": "losslens.study.sweep.plan:Plan",
    "Store": "losslens.study.sweep.store:Store",
    "run_sweep": "losslens.study.sweep.executor:run_sweep",
    "summary": "losslens.study.analysis.summary:summary",
    # errors and warnings
    "LosslensError": "losslens.geometry.base.errors:LosslensError",
    "LosslensWarning": "losslens.geometry.base.errors:LosslensWarning",
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    """The public ``name``, imported from its module on first use and kept."""
    try:
        module, attr = _WHERE[name].split(":")
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

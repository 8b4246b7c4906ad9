"""The LM loss under the import path of the first release (``from probes.lm import lm_loss``).

The code lives in :mod:`probes.core.lm`; this module only keeps the README's earlier example and
users' scripts working.
"""

from .core.lm import LossError, LossResult, check_batch, evaluate, lm_loss, target_count

__all__ = ["lm_loss", "evaluate", "check_batch", "target_count", "LossResult", "LossError"]

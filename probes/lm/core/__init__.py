"""The pieces every room of probes uses; imports no other room of probes (only geometry).

- :mod:`.lm`       -- :func:`lm_loss` (mean next-token cross-entropy, nats), :func:`evaluate`
  (loss and perplexity over a token set), :func:`check_batch`, :class:`ExcludingLoss` (the loss
  without some token ids, as inputs and targets);
- :mod:`.tokenset` -- :class:`TokenSet`: a fixed [n_batches, batch, seq] set of token ids, hashed,
  saved as safetensors (built from text in :mod:`losslens.lm.data`);
- :mod:`.modules`  -- :func:`find_blocks` (the decoder blocks) and :func:`select_linears` (the
  linears a quantizer or weight statistic touches);
- :mod:`.numerics` -- :func:`rel_error` (‖a − b‖ / ‖b‖ in float64);
- :mod:`.threads`  -- :func:`torch_threads` (torch's thread count for a block, restored after);
- :mod:`.schedules` -- the base LR schedules as pure functions (constant, WSD, cosine, linear).
- :mod:`.workers`  -- :class:`WorkerPool` (jobs in N fresh worker processes, results streamed back);
- :mod:`.worker_loop` -- the worker's side of the pool: :func:`emit` (a result from inside a job),
  :func:`short_error` (an exception as one line), :class:`WorkerError`.
"""

from losslens.lm.core.next_token_loss import ExcludingLoss, LossError, LossResult, check_batch, evaluate, lm_loss
from losslens.lm.core.modules import ModuleSelectionError, find_blocks, select_linears
from losslens.lm.core.numerics import rel_error
from losslens.lm.core.threads import torch_threads
from losslens.lm.core.tokenset import TokenSet, TokenSetError

__all__ = [
    "lm_loss",
    "evaluate",
    "check_batch",
    "ExcludingLoss",
    "LossResult",
    "LossError",
    "TokenSet",
    "TokenSetError",
    "find_blocks",
    "select_linears",
    "ModuleSelectionError",
    "rel_error",
    "torch_threads",
]

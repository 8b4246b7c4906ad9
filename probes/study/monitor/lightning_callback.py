"""The robustness monitor as a Lightning ``Callback`` (:class:`LightningRobustnessCallback`).

    cb = LightningRobustnessCallback("run.sqlite", eval_set=heldout_ids, every=50)
    L.Trainer(max_steps=1000, callbacks=[cb]).fit(module, loader)

It measures after every ``every``-th optimizer step (``on_train_batch_end``, default 50; steps are
``trainer.global_step``), checks the memory fit in ``on_fit_start`` (before the first step), and
logs the values with ``pl_module.log`` (keys ``monitor/...``, as the HF callback). The language
model measured is ``pl_module.<model_attr>`` (default: the attribute ``model`` when the module has
one, else the module itself); it must take ``input_ids`` and return logits (or an HF output).

The LR recorded at step t is the first optimizer's LR read in ``on_train_batch_start`` of that
update, i.e. before its scheduler steps. Tokens: counted from the batches seen (``input_ids`` of
a dict batch, or a tensor batch) unless ``tokens_per_step`` is given.
"""

from __future__ import annotations

import torch
from lightning.pytorch import Callback

from losslens.study.monitor.monitor import Measurement, RobustnessMonitor

__all__ = ["LightningRobustnessCallback"]


def _batch_tokens(batch) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.numel())
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return int(batch["input_ids"].numel())
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return int(batch[0].numel())
    return None


class LightningRobustnessCallback(Callback):
    """Measures ΔQ, loss and curvature of the LightningModule's language model every ``every``
    steps into a sweep store. Arguments: those of :class:`~losslens.study.monitor.RobustnessMonitor`, plus
    ``model_attr`` (the attribute holding the LM; None: ``model`` if present, else the module)."""

    def __init__(
        self,
        store,
        eval_set,
        curvature_set=None,
        model_attr: str | None = None,
        monitor: RobustnessMonitor | None = None,
        **kwargs,
    ):
        kwargs.setdefault("every", 50)
        self.monitor = monitor if monitor is not None else RobustnessMonitor(store, eval_set, curvature_set, **kwargs)
        self.model_attr = model_attr
        self._lr: float | None = None
        self._tokens = 0
        self._counting = True
        self.measurements: list[Measurement] = []

    def _lm(self, pl_module):
        if self.model_attr is not None:
            return getattr(pl_module, self.model_attr)
        return getattr(pl_module, "model", pl_module)

    def on_fit_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.monitor.prepare(self._lm(pl_module))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        opts = trainer.optimizers
        if opts and opts[0].param_groups:
            self._lr = float(opts[0].param_groups[0]["lr"])  # read only: the LR of this update
        n = _batch_tokens(batch)
        if n is None:
            self._counting = False
        elif self._counting:
            self._tokens += n * max(1, trainer.world_size)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(trainer.global_step)
        every = self.monitor.settings.every or 50
        if step == 0 or step % every or not trainer.is_global_zero:
            return
        if self.measurements and self.measurements[-1].step == step:  # gradient accumulation: one per update
            return
        tokens = self._tokens if self._counting and self.monitor.tokens_per_step is None else None
        m = self.monitor.maybe_measure(self._lm(pl_module), step, lr=self._lr, tokens=tokens)
        if m is None:
            return
        self.measurements.append(m)
        for k, v in m.values.items():
            pl_module.log(f"monitor/{k}", float(v), on_step=True, on_epoch=False, rank_zero_only=True)

    def on_fit_end(self, trainer, pl_module):
        self.monitor._record_meta()

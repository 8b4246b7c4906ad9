"""Sequential GPTQ through a whole language model: hooks, block-by-block calibration, true-sequential order.

Walk (the reference's ``llama_sequential`` generalised, no per-architecture table):

1. **Capture block 0's inputs.** A forward pre-hook (``with_kwargs=True``) on the first decoder block
   records, for every calibration batch, the hidden states it receives from the embeddings and every
   other keyword the model passes to its blocks (position embeddings, attention masks, position ids,
   ...), then aborts the forward. The model runs with ``use_cache=False``.
2. **For each block** (in order): a discovery pass on one batch records which selected linears fire,
   in which order, and which of them read the *same input tensor* (q/k/v, gate/up); those form one
   group sharing one H. Then, group by group in firing order (true-sequential), all calibration
   inputs are pushed through the block — whose earlier groups are already quantized — while a hook
   on the group's first linear accumulates H = (2/n) Σ x xᵀ over the n token rows and then stops
   the forward early; the group's linears are GPTQ-quantized with that H. Finally the block is
   re-run on all inputs to produce the next block's inputs (from the quantized block).
3. Selected linears outside the decoder blocks (only when the user's globs ask for them) are handled
   the same way with whole-model forwards, after all blocks.

Memory: the calibration activations of one block boundary (n_batches × batch × seq × hidden) plus
one H per group; nothing model-sized beyond the model itself. Cost: for each block,
(groups + 2) block forwards over the calibration set (group passes stop early) and one GPTQ per linear.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from torch import nn

from losslens.geometry.base.modes import module_modes
from losslens.lm.core.modules import ModuleSelectionError, find_blocks

from losslens.lm.quant.quant_errors import CalibrationError
from losslens.lm.quant.gptq import GPTQResult, gptq_quantize
from losslens.lm.quant.gptq_preset import SequenceHessian, gptqmodel_quantize
from losslens.lm.quant.rtn import rtn_quantize


class _Stop(Exception):
    """Raised inside a hook to end a forward early once the needed inputs are captured."""


def _first_tensor(x):
    return x[0] if isinstance(x, tuple) else x


def _call_model(model: nn.Module, ids: torch.Tensor):
    if hasattr(model, "config") and hasattr(model.config, "vocab_size"):
        kwargs = {"input_ids": ids}
        if hasattr(model.config, "use_cache"):
            kwargs["use_cache"] = False
        return model(**kwargs)
    return model(ids)


def capture_block_inputs(
    model: nn.Module, block: nn.Module, batches: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, tuple, dict]]:
    """Per batch: (hidden states, other positional args, kwargs) that ``block`` receives.

    Cost: one model forward per batch, stopped at the block.
    """
    captured: list = []

    def pre_hook(mod, args, kwargs):
        if args:
            hidden, rest = args[0], tuple(args[1:])
        else:
            kwargs = dict(kwargs)
            hidden, rest = kwargs.pop("hidden_states"), ()
        captured.append((hidden.detach(), rest, dict(kwargs)))
        raise _Stop

    device = next(model.parameters()).device
    handle = block.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        for ids in batches:
            try:
                _call_model(model, ids.to(device=device, dtype=torch.long))
            except _Stop:
                pass
            else:
                raise CalibrationError("the model's forward never reached its first decoder block")
    finally:
        handle.remove()
    return captured


def _run_block(block: nn.Module, inp) -> torch.Tensor:
    hidden, rest, kwargs = inp
    if "hidden_states" in kwargs:
        return _first_tensor(block(**{**kwargs, "hidden_states": hidden}))
    return _first_tensor(block(hidden, *rest, **kwargs))


def discover_groups(run: Callable[[], None], linears: dict[str, nn.Linear]) -> list[list[str]]:
    """Groups of linears reading the same input tensor, in hook firing order, from one call of ``run``.

    A linear that never fires is reported as its own group at the end (it gets H = 0: all dead).
    """
    order: list[str] = []
    inputs: list[torch.Tensor] = []  # keep tensors alive so identity checks are sound
    group_of: dict[str, int] = {}
    handles = []

    def make(name):
        def hook(mod, args):
            if name in group_of:
                return
            x = args[0]
            for k, t in enumerate(inputs):
                if t is x or (t.data_ptr() == x.data_ptr() and t.shape == x.shape and t.stride() == x.stride()):
                    group_of[name] = k
                    break
            else:
                group_of[name] = len(inputs)
                inputs.append(x)
            order.append(name)

        return hook

    for name, lin in linears.items():
        handles.append(lin.register_forward_pre_hook(make(name)))
    try:
        run()
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    groups: dict[int, list[str]] = {}
    for name in order:
        groups.setdefault(group_of[name], []).append(name)
    out = list(groups.values())
    out += [[n] for n in linears if n not in group_of]
    return out


class _HessianHook:
    """Accumulates Σ x xᵀ over the token rows of a linear's input; optionally stops the forward."""

    def __init__(self, in_features: int, device, dtype, stop: bool):
        self.S = torch.zeros(in_features, in_features, device=device, dtype=dtype)
        self.n = 0
        self.stop = stop

    def __call__(self, mod, args):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).to(self.S.dtype)
        self.S.addmm_(x.t(), x)
        self.n += x.shape[0]
        if self.stop:
            raise _Stop

    def hessian(self) -> torch.Tensor:
        """H = (2/n) Σ x xᵀ (n = token rows seen)."""
        return self.S * (2.0 / max(self.n, 1))


def _gptq_group(linears: dict[str, nn.Linear], names: list[str], hook: "_HessianHook", spec, on_layer) -> None:
    H = hook.hessian()
    for name in names:
        lin = linears[name]
        if hook.n == 0:  # never ran on the calibration data: nothing to calibrate on
            t0 = time.perf_counter()
            q = rtn_quantize(lin.weight.data, spec.bits, spec.group_size, spec.symmetric)
            on_layer(
                name,
                lin,
                GPTQResult(
                    q,
                    0.0,
                    float("nan"),
                    time.perf_counter() - t0,
                    ["never called on the calibration data; quantized with RTN instead"],
                ),
            )
            continue
        if getattr(spec, "variant", "reference") == "gptqmodel":
            res = gptqmodel_quantize(
                lin.weight.data, H, spec.bits, spec.group_size, spec.symmetric, spec.act_order, spec.damp, name=name
            )
        else:
            res = gptq_quantize(
                lin.weight.data,
                H,
                spec.bits,
                spec.group_size,
                spec.symmetric,
                spec.act_order,
                spec.static_groups,
                spec.damp,
                spec.block_size,
                name=name,
            )
        on_layer(name, lin, res)


def _hessian_dtype(weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, torch.float32)


def _hessian_hook(first: nn.Linear, spec):
    """The H accumulator of ``spec``'s variant: per-batch ``addmm`` (reference) or GPTQModel's
    per-sequence float32 sums (:class:`losslens.lm.quant.gptq_preset.SequenceHessian`)."""
    if getattr(spec, "variant", "reference") == "gptqmodel":
        return SequenceHessian(first.in_features, first.weight.device, stop_exc=_Stop)
    return _HessianHook(first.in_features, first.weight.device, _hessian_dtype(first.weight), stop=True)


@torch.no_grad()
def partition_by_block(
    model: nn.Module, linears: dict[str, nn.Linear]
) -> tuple[list[nn.Module], list[dict[str, nn.Linear]], dict[str, nn.Linear]]:
    """Split the selected ``linears`` by decoder block: ``(blocks, per-block linears, outside)``.

    ``outside`` holds the selected linears in no block (e.g. ``lm_head`` chosen by glob); a model
    without decoder blocks puts every linear there (quantized through whole-model passes).
    """
    try:
        prefix, blocks = find_blocks(model)
    except ModuleSelectionError:
        prefix, blocks = "", []
    in_block: list[dict[str, nn.Linear]] = []
    taken: set[str] = set()
    for k in range(len(blocks)):
        bp = f"{prefix}.{k}." if prefix else f"{k}."
        sel = {n: m for n, m in linears.items() if n.startswith(bp)}
        in_block.append(sel)
        taken |= set(sel)
    return blocks, in_block, {n: m for n, m in linears.items() if n not in taken}


def gptq_sequential(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    linears: dict[str, nn.Linear],
    spec,
    on_layer: Callable[[str, nn.Linear, GPTQResult], None],
    progress: bool = False,
) -> None:
    """Quantize ``linears`` (names → modules of ``model``) in place with sequential GPTQ.

    ``on_layer(name, linear, result)`` is called after each layer's GPTQ; it must write
    ``result.weight`` into ``linear`` (the driver relies on it for the following groups and blocks).
    """
    from losslens.geometry.base.progress import progress_bar

    blocks, in_block, outside = partition_by_block(model, linears)
    n_in_blocks = sum(len(sel) for sel in in_block)

    with module_modes(model, training=False):
        if n_in_blocks:
            inps = capture_block_inputs(model, blocks[0], batches)
            bar = progress_bar(progress, n_in_blocks, what="GPTQ", unit="layer", label="quantize")
            last = max(k for k, sel in enumerate(in_block) if sel)
            for k, block in enumerate(blocks):
                sel = in_block[k]
                if sel:
                    groups = discover_groups(lambda: _run_block(block, inps[0]), sel)
                    for names in groups:
                        first = sel[names[0]]
                        hook = _hessian_hook(first, spec)
                        h = first.register_forward_pre_hook(hook)
                        try:
                            for inp in inps:
                                try:
                                    _run_block(block, inp)
                                except _Stop:
                                    pass
                        finally:
                            h.remove()
                        _gptq_group(sel, names, hook, spec, on_layer)
                        bar.update(len(names))
                if k >= last:
                    break
                for i, inp in enumerate(inps):  # replace batch by batch: one boundary's activations at a time
                    inps[i] = (_run_block(block, inp).detach(), inp[1], inp[2])
            bar.close()
            del inps
        if outside:
            device = next(model.parameters()).device

            def run_all(first_only=False):
                for ids in batches[:1] if first_only else batches:
                    try:
                        _call_model(model, ids.to(device=device, dtype=torch.long))
                    except _Stop:
                        if first_only:
                            raise

            groups = discover_groups(lambda: run_all(first_only=True), outside)
            for names in groups:
                first = outside[names[0]]
                hook = _hessian_hook(first, spec)
                h = first.register_forward_pre_hook(hook)
                try:
                    run_all()
                finally:
                    h.remove()
                _gptq_group(outside, names, hook, spec, on_layer)

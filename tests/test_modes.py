"""Mixed per-module train/eval modes survive every call that switches a model to eval for a while
(issue #12, item 5): evaluate, evaluate_surface, the GPTQ and AWQ drivers. Before the fix each
restored ``model.train(was_training)``, which flattened the submodules to the top module's mode."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from losslens.geometry.base.modes import module_modes
from losslens.geometry.surfaces.random_planes import random_plane
from losslens.geometry.surfaces.surface import evaluate_surface
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.models.families import tiny_model
from losslens.lm.quant import quantize

VOCAB = 96


def _mixed(family: str = "llama") -> nn.Module:
    """A tiny model in train mode whose first decoder layer and final norm are in eval mode."""
    model = tiny_model(family, hidden_size=16, intermediate_size=32, num_hidden_layers=2)
    model.train()
    model.model.layers[0].eval()
    model.model.norm.eval()
    return model


def _modes(model: nn.Module) -> dict[str, bool]:
    return {n: m.training for n, m in model.named_modules()}


def _batches(n=2, b=2, s=12, seed=3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (b, s), generator=g) for _ in range(n)]


class _SeenModes:
    """Forward pre-hooks on every module: the ``training`` flags seen while the model runs."""

    def __init__(self, model: nn.Module):
        self.seen: set[bool] = set()
        self.handles = [
            m.register_forward_pre_hook(lambda mod, args: self.seen.add(mod.training)) for m in model.modules()
        ]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def test_mixed_fixture_really_is_mixed():
    modes = _modes(_mixed())
    assert True in modes.values() and False in modes.values()


def test_module_modes_restores_each_module_also_on_error():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.1), nn.Linear(2, 1)))
    net.train()
    net[2].eval()
    before = _modes(net)
    with module_modes(net) as m:
        assert m is net and not any(_modes(net).values())
    assert _modes(net) == before
    with pytest.raises(RuntimeError, match="boom"):
        with module_modes(net, training=True):
            assert all(_modes(net).values())
            raise RuntimeError("boom")
    assert _modes(net) == before


def test_evaluate_keeps_mixed_modes_and_runs_in_eval():
    model = _mixed()
    before = _modes(model)
    hooks = _SeenModes(model)
    try:
        evaluate(model, _batches())
    finally:
        hooks.remove()
    assert hooks.seen == {False}  # every module ran in eval mode
    assert _modes(model) == before


def test_evaluate_surface_keeps_mixed_modes_and_runs_in_eval():
    model = _mixed()
    before = _modes(model)
    center = {n: p.detach().clone() for n, p in model.named_parameters()}
    plane = random_plane(center, seed=0)
    hooks = _SeenModes(model)
    try:
        s = evaluate_surface(model, lm_loss, _batches(n=1), plane, (np.array([-0.1, 0.0, 0.1]), np.array([0.0])))
    finally:
        hooks.remove()
    assert hooks.seen == {False}
    assert _modes(model) == before
    assert np.isfinite(s.loss).all()


@pytest.mark.parametrize("spec", ["gptq:4:g16", "awq:4:g16"])
@pytest.mark.parametrize("inplace", [False, True])
def test_calibrated_quantizers_keep_mixed_modes(spec, inplace):
    model = _mixed()
    before = _modes(model)
    calib = torch.stack(_batches(n=2, b=4, s=16, seed=5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qm = quantize(model, spec, calibration=calib, inplace=inplace)
    assert _modes(qm.model) == before
    assert _modes(model) == before

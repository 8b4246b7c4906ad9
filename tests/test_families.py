"""Every seed family end to end (tiny random-init models, CPU): loss, HVP backends, Hutch++, the
second-order check, RTN / INT8 / GPTQ / AWQ (+ bitsandbytes when installed) through the generic
block/linear discovery, the quantization plane and a 3-checkpoint sweep."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch
from torch import nn

from losslens.lm.models.families import FAMILIES, tiny_model
from losslens.lm.models.second_order import check_second_order, ensure_second_order

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
HAS_SURFACE = importlib.util.find_spec("losslens.geometry.surfaces.surface") is not None
HAS_SWEEP = importlib.util.find_spec("losslens.study.sweep") is not None
VOCAB = 96
G = 16  # group size: hidden 32 -> 2 groups per row on the attention/MLP-in matrices


@pytest.fixture(autouse=True, scope="module")
def _quiet_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _sets():
    from losslens.lm.core.tokenset import TokenSet

    g = torch.Generator().manual_seed(123)
    return {
        "eval": TokenSet(torch.randint(0, VOCAB, (2, 2, 16), generator=g), "eval"),
        "calibration": TokenSet(torch.randint(0, VOCAB, (2, 4, 16), generator=g), "calibration"),
        "curvature": TokenSet(torch.randint(0, VOCAB, (1, 2, 8), generator=g), "curvature"),
    }


def _execution_order(model: nn.Module, batch: torch.Tensor, names: list[str]) -> list[str]:
    order: list[str] = []
    mods = dict(model.named_modules())
    hs = [
        mods[n].register_forward_pre_hook(lambda m, a, n=n: order.append(n) if n not in order else None) for n in names
    ]
    with torch.no_grad():
        model(input_ids=batch)
    for h in hs:
        h.remove()
    return order


def _perturbed(model: nn.Module, seed: int, scale: float = 0.02) -> nn.Module:
    import copy

    g = torch.Generator().manual_seed(seed)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_end_to_end(family, tmp_path):
    from losslens.geometry.operators.hessian import HessianOperator
    from losslens.geometry.estimators.trace import hutchpp_trace
    from losslens.lm.core.next_token_loss import evaluate, lm_loss
    from losslens.lm.core.modules import find_blocks, select_linears
    from losslens.lm.quant import quantization_error, quantize

    sets = _sets()
    batch = sets["curvature"].tokens[0]

    # ---- LM loss -------------------------------------------------------------------------
    model = tiny_model(family)
    assert type(model).__name__ == FAMILIES[family].model_class
    fp = evaluate(model, sets["eval"])
    assert math.isfinite(fp.loss) and 3.0 < fp.loss < 8.0
    assert tiny_model(family).state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(tiny_model(family).parameters(), model.parameters()))  # seeded

    # ---- HVP: both backends agree (float64), Hutch++ runs, second-order check passes -------------
    m64 = tiny_model(family, dtype=torch.float64)
    rev = HessianOperator(m64, lm_loss, [batch], backend="reverse")
    fwd = HessianOperator(m64, lm_loss, [batch], backend="forward")
    V = torch.randn(3, rev.dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    hr, hf = rev.matmat_flat(V), fwd.matmat_flat(V)
    rel = float((hr - hf).norm() / hr.norm())
    # HF norms / softmax compute in float32 even in a float64 model: agreement ~1e-7, not 1e-15
    assert rel < 1e-6, f"{family}: reverse and forward HVPs differ by {rel:.2e}"
    tr = hutchpp_trace(rev, num_matvecs=9, seed=0)
    tr_f = hutchpp_trace(fwd, num_matvecs=9, seed=0)
    assert math.isfinite(tr.value) and tr.num_matvecs == 9
    # same seed, same probes: the estimates differ only by the backends' ~1e-7 HVP rounding (the trace
    # sums eigenvalues of both signs, so its relative difference can be larger)
    assert tr_f.value == pytest.approx(tr.value, rel=1e-3, abs=1e-6)
    rep = check_second_order(model, batch)
    assert rep.ok and rep.recommended == "reverse", rep.message()
    assert rep.backend_agreement < 1e-6 and rep.custom_functions == ()
    assert ensure_second_order(model, batch) == "reverse"

    # ---- quantizers: generic block / linear discovery, true-sequential order -------------------
    prefix, blocks = find_blocks(model)
    assert len(blocks) == 2
    linears = list(select_linears(model))
    per_block = len(linears) // 2
    assert per_block >= 4 and all(n.startswith(prefix + ".") for n in linears)
    order = _execution_order(model, batch, linears)
    specs = [f"rtn:4:g{G}", "int8", f"gptq:4:g{G}", f"awq:4:g{G}"]
    if HAS_BNB:
        specs += ["bnb-int8", "bnb-nf4"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    qmodels, errors = {}, {}
    for spec in specs:
        qm = quantize(model, spec, calibration=sets["calibration"])
        names = qm.names
        assert sorted(names) == sorted(linears), spec
        if spec.startswith(("gptq", "awq")):
            assert names == order, f"{spec}: quantized in {names}, executed in {order}"
        qp = dict(qm.model.named_parameters())
        for n, p in before.items():
            changed = not torch.equal(qp[n], p)
            assert changed == (n[: -len(".weight")] in linears and n.endswith(".weight")), (spec, n)
        assert all(0 < r.rel_weight_error < 0.5 for r in qm.report), spec
        qmodels[spec] = qm.model
        err = quantization_error(model, spec, sets["eval"], calibration=sets["calibration"], fp_loss=fp.loss)
        assert math.isfinite(err.q_loss) and abs(err.rel_loss_error) < 0.2, (spec, err)
        errors[spec] = qm.layer_errors
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # original untouched
    # on a random model loss changes are noise-signed; weight errors order as the grids do
    assert all(errors["int8"][n] < errors[f"rtn:4:g{G}"][n] for n in linears)

    # ---- quantization plane: A = model, B = perturbed, C = quantized -------------------------------
    if HAS_SURFACE:
        from losslens.geometry.surfaces.point_planes import plane_through_points
        from losslens.geometry.surfaces.surface import evaluate_surface

        A = {n: p.detach().clone() for n, p in model.named_parameters()}
        B = dict(_perturbed(model, 7).named_parameters())
        C = dict(qmodels[f"rtn:4:g{G}"].named_parameters())
        plane = plane_through_points(A, {n: p.detach() for n, p in B.items()}, {n: p.detach() for n, p in C.items()})
        surf = evaluate_surface(model, lm_loss, list(sets["eval"]), plane, grid=3)
        assert surf.loss.shape == (3, 3) and torch.isfinite(torch.as_tensor(surf.loss)).all()
        for label, q in (("A", model), ("C", qmodels[f"rtn:4:g{G}"])):
            assert surf.points[label][2] == pytest.approx(evaluate(q, sets["eval"]).loss, rel=1e-4)
        assert all(torch.equal(p, A[n]) for n, p in model.named_parameters())

    # ---- 3-checkpoint sweep --------------------------------------------------------------------
    if HAS_SWEEP:
        from losslens.lm.checkpoints import Trajectory
        from losslens.study.sweep import Plan, Store, run_sweep
        from losslens.study.sweep import TraceProbe

        folder = tmp_path / "traj"
        for step in (1, 2, 3):
            _perturbed(model, step).save_pretrained(folder / f"step-{step}")
        traj = Trajectory.from_folder(folder)
        assert [r.step for r in traj] == [1, 2, 3]
        plan = Plan(loss=True, quant=(f"rtn:4:g{G}",), trace=TraceProbe("hutch++", 3), name=family)
        out = tmp_path / "r.sqlite"
        srep = run_sweep(traj, plan, out=out, token_sets=sets, progress=False)
        assert srep.n_failed == 0, srep.failures
        with Store(out) as st:
            df = st.results()
        assert (df.status == "ok").all() and df.value.notna().all()
        assert set(df.checkpoint) == {r.label for r in traj} and set(df.probe) == {"loss", "quant", "trace"}


# --------------------------------------------------------------------------- ops without rules
class _NoJvpSiLU(torch.autograd.Function):
    """Correct, twice-differentiable backward; no forward-AD / vmap rule."""

    @staticmethod
    def forward(x):
        return x * torch.sigmoid(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s))


class _DetachedSiLU(_NoJvpSiLU):
    """A backward that is not itself differentiable: double backward is silently wrong."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x = x.detach()
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s))


class _Act(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn.apply(x)


def _with_act(fn):
    model = tiny_model("llama", num_hidden_layers=1)
    for layer in model.model.layers:
        layer.mlp.act_fn = _Act(fn)
    return model


def test_missing_forward_ad_rule_falls_back_to_reverse():
    from losslens.lm.models.second_order import SecondOrderWarning

    model = _with_act(_NoJvpSiLU)
    batch = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    rep = check_second_order(model, batch, preferred="forward")
    assert rep.reverse.ok and not rep.forward.ok and rep.recommended == "reverse"
    assert "_NoJvpSiLU" in rep.forward.ops and "_NoJvpSiLU" in rep.message()
    assert rep.custom_functions == ("model.layers.0.mlp.act_fn (_Act): _NoJvpSiLU",)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert ensure_second_order(model, batch, backend="forward", cache=False) == "reverse"
    msgs = [str(x.message) for x in w if issubclass(x.category, SecondOrderWarning)]
    assert msgs and "_NoJvpSiLU" in msgs[0] and "falling back" in msgs[0]


def test_silently_wrong_double_backward_is_caught():
    from losslens.lm.models.second_order import SecondOrderError

    model = _with_act(_DetachedSiLU)
    batch = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    rep = check_second_order(model, batch)
    assert not rep.reverse.ok and rep.reverse.error is None and rep.reverse.rel_error_fd > 10 * rep.rtol
    assert rep.recommended is None and not rep.usable
    assert "WRONG Hessian" in rep.message() and "_DetachedSiLU" in rep.message()
    with pytest.raises(SecondOrderError, match="_DetachedSiLU"):
        ensure_second_order(model, batch, cache=False)
    # the model is left exactly as it was (FD steps restored, float64 copy used)
    assert next(model.parameters()).dtype == torch.float32


def test_curvature_safe_switches_attention_and_restores():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from losslens.lm.models.second_order import SecondOrderWarning, curvature_safe

    AttentionInterface.register("fused_test_kernel", sdpa_attention_forward)
    model = tiny_model("olmo2", attn="fused_test_kernel")
    batch = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    rep = check_second_order(model, batch)
    assert any("fused_test_kernel" in m for m in rep.messages) and rep.ok
    with pytest.warns(SecondOrderWarning, match="fused_test_kernel"):
        with curvature_safe(model):
            assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "fused_test_kernel"
    ap = tiny_model("apertus", num_hidden_layers=1)
    act = ap.model.layers[0].mlp.act_fn
    sentinel = object()
    act._xielu_cuda_obj = sentinel  # as if the CUDA wheel were installed
    with pytest.warns(SecondOrderWarning, match="xIELU"):
        with curvature_safe(ap):
            assert act._xielu_cuda_obj is None
    assert act._xielu_cuda_obj is sentinel


def test_lm_hessian_checks_the_architecture_before_any_product():
    """Sweeps and `losslens sharpness` build their operator through lm_hessian: a silently wrong
    double backward is refused, a missing forward-AD rule falls back to the reverse backend."""
    from losslens.lm.models.curvature import lm_hessian
    from losslens.lm.models.second_order import SecondOrderError, SecondOrderWarning

    batches = [torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))]
    with pytest.raises(SecondOrderError, match="_DetachedSiLU"):
        lm_hessian(_with_act(_DetachedSiLU), batches)
    with pytest.warns(SecondOrderWarning, match="_NoJvpSiLU"):
        op = lm_hessian(_with_act(_NoJvpSiLU), batches, backend="forward")
    assert op.backend == "reverse"

"""Model-level quantize(): sequential GPTQ through tiny GPT-NeoX and Llama models, the interface, bad input."""

from __future__ import annotations

import pytest
import torch

from losslens.lm.quant import (
    CalibrationError,
    ModuleSelectionError,
    QuantizedModel,
    QuantSpec,
    SpecError,
    gptq_quantize,
    int8_quantize,
    quantize,
    rtn_quantize,
)
from losslens.lm.quant.sequential import capture_block_inputs, discover_groups, _run_block
from losslens.lm.core.modules import find_blocks
from losslens.lm.core.tokenset import TokenSet

VOCAB, HIDDEN, CTX = 61, 32, 48


def neox(seed=0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=CTX,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg).double().eval()


def llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=CTX,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # non-trivial norms so that block inputs differ per layer
        for n, p in m.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.3)
    return m.double().eval()


def calib(n=3, b=2, s=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return TokenSet(torch.randint(0, VOCAB, (n, b, s), generator=g), name="calibration")


def collect_hessians(model, names, batches):
    """H = (2/n) Σ x xᵀ of every named linear's input, on the given (final) model."""
    mods = dict(model.named_modules())
    acc = {n: [0, 0] for n in names}
    hooks = []
    for n in names:

        def hook(mod, args, n=n):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            acc[n][0] = acc[n][0] + x.T @ x
            acc[n][1] += x.shape[0]

        hooks.append(mods[n].register_forward_pre_hook(hook))
    with torch.no_grad():
        for ids in batches:
            model(input_ids=ids)
    for h in hooks:
        h.remove()
    return {n: 2.0 / c * S for n, (S, c) in acc.items()}


@pytest.mark.parametrize("factory", [neox, llama])
def test_execution_order_groups(factory):
    model = factory()
    prefix, blocks = find_blocks(model)
    lin = {n: m for n, m in blocks[0].named_modules() if isinstance(m, torch.nn.Linear)}
    inps = capture_block_inputs(model, blocks[0], list(calib()))
    groups = discover_groups(lambda: _run_block(blocks[0], inps[0]), lin)
    if factory is llama:
        assert groups == [
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            ["self_attn.o_proj"],
            ["mlp.gate_proj", "mlp.up_proj"],
            ["mlp.down_proj"],
        ]
        assert "position_embeddings" in inps[0][2]  # forward kwargs are captured and passed on
    else:
        assert groups == [
            ["attention.query_key_value"],
            ["attention.dense"],
            ["mlp.dense_h_to_4h"],
            ["mlp.dense_4h_to_h"],
        ]
    # the captured block-0 inputs are the embeddings' output
    out = model(input_ids=list(calib())[0], output_hidden_states=True)
    torch.testing.assert_close(inps[0][0], out.hidden_states[0])


@pytest.mark.parametrize(
    "factory, spec",
    [(neox, "gptq:4:g16"), (llama, "gptq:3:row:act"), (llama, "gptq:4:g16:act:static"), (neox, "gptq:3:g16:sym")],
)
def test_sequential_gptq_is_true_sequential(factory, spec):
    """Every layer's result equals per-layer GPTQ on the inputs it sees in the *final* quantized model,
    i.e. with every layer executed before it (earlier blocks and earlier groups of its block) quantized."""
    model = factory()
    orig = {n: p.detach().clone() for n, p in model.named_parameters()}
    cal = calib()
    qm = quantize(model, spec, calibration=cal)
    s = QuantSpec.parse(spec)
    names = qm.names
    assert len(names) == 8 if factory is neox else len(names) == 14
    H = collect_hessians(qm.model, names, list(cal))
    for name in names:
        W0 = orig[name + ".weight"]
        want = gptq_quantize(W0, H[name], s.bits, s.group_size, s.symmetric, s.act_order, s.static_groups).weight
        got = dict(qm.model.named_modules())[name].weight
        assert float((got.detach() - want).norm() / want.norm()) < 1e-6, name
    # the original is untouched
    for n, p in model.named_parameters():
        assert torch.equal(p, orig[n]), n
    for r in qm.report:
        assert 0 < r.rel_weight_error < 1 and r.damping == 0.01 and r.seconds >= 0


def test_not_true_sequential_would_differ():
    # sanity: H from the FP model differs from H in the quantized model for later blocks
    model = neox()
    cal = calib()
    qm = quantize(model, "gptq:3:g16", calibration=cal)
    name = qm.names[-1]
    H_fp = collect_hessians(model, [name], list(cal))[name]
    H_q = collect_hessians(qm.model, [name], list(cal))[name]
    assert float((H_fp - H_q).norm() / H_q.norm()) > 1e-4


def test_rtn_int8_through_interface_and_inplace():
    model = neox()
    orig = {n: p.detach().clone() for n, p in model.named_parameters()}
    qm = quantize(model, "rtn:3:g16")
    assert isinstance(qm, QuantizedModel) and str(qm.spec) == "rtn:3:g16"
    mods = dict(qm.model.named_modules())
    for r in qm.report:
        torch.testing.assert_close(mods[r.name].weight, rtn_quantize(orig[r.name + ".weight"], 3, 16), rtol=0, atol=0)
        assert r.damping is None
    # embeddings / head / norms untouched in the copy
    for n, p in qm.model.named_parameters():
        if not any(n == r.name + ".weight" for r in qm.report):
            assert torch.equal(p, orig[n]), n
    assert all(torch.equal(p, orig[n]) for n, p in model.named_parameters())
    qi = quantize(model, "int8", inplace=True)
    assert qi.model is model
    name = qi.names[0]
    torch.testing.assert_close(dict(model.named_modules())[name].weight, int8_quantize(orig[name + ".weight"]))


def test_module_globs():
    model = llama()
    qm = quantize(model, "gptq:4:g16", calibration=calib(), modules="*.mlp.*")
    assert qm.names == [f"model.layers.{k}.mlp.{p}" for k in range(2) for p in ("gate_proj", "up_proj", "down_proj")]
    mods = dict(qm.model.named_modules())
    assert torch.equal(
        mods["model.layers.0.self_attn.q_proj"].weight,
        dict(model.named_modules())["model.layers.0.self_attn.q_proj"].weight,
    )
    # a linear outside the blocks, chosen explicitly, is quantized after the blocks
    qh = quantize(model, "gptq:4:g16", calibration=calib(), modules=["lm_head", "model.layers.1.mlp.down_proj"])
    assert qh.names == ["model.layers.1.mlp.down_proj", "lm_head"]
    H = collect_hessians(qh.model, ["lm_head"], list(calib()))["lm_head"]
    want = gptq_quantize(model.lm_head.weight, H, 4, 16).weight
    assert float((qh.model.lm_head.weight.detach() - want).norm() / want.norm()) < 1e-6
    with pytest.raises(ModuleSelectionError, match="matches no nn.Linear"):
        quantize(model, "rtn:4:g16", modules="*.nothing_like_this")


def test_calibration_forms_and_float32():
    model = neox().float()
    cal = calib()
    a = quantize(model, "gptq:4:g16", calibration=cal)
    b = quantize(model, "gptq:4:g16", calibration=cal.tokens)
    c = quantize(model, "gptq:4:g16", calibration=list(cal))
    for n in a.names:
        wa = dict(a.model.named_modules())[n].weight
        assert torch.equal(wa, dict(b.model.named_modules())[n].weight)
        assert torch.equal(wa, dict(c.model.named_modules())[n].weight)
        assert wa.dtype == torch.float32


def test_bad_input():
    model = neox()
    with pytest.raises(CalibrationError, match="needs calibration"):
        quantize(model, "gptq:4:g128")
    with pytest.raises(CalibrationError, match="calibration too short"):
        quantize(model, "gptq:4:g16", calibration=calib(n=1, b=1, s=16))  # 16 rows < 64 in-features
    with pytest.raises(CalibrationError, match="context"):
        quantize(model, "gptq:4:g16", calibration=torch.randint(0, VOCAB, (2, 4, CTX + 1)))
    with pytest.raises(CalibrationError, match="vocabulary"):
        quantize(model, "gptq:4:g16", calibration=torch.full((2, 4, 16), VOCAB + 3))
    with pytest.raises(CalibrationError):
        quantize(model, "gptq:4:g16", calibration=[])
    with pytest.raises(SpecError):
        quantize(model, "gptq:9:g16", calibration=calib())
    with pytest.raises(SpecError):
        quantize(model, "rtn:4:g0")


def test_model_without_blocks_uses_whole_model_passes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)
    ).double()
    cal = torch.randint(0, VOCAB, (2, 4, 8))
    W1, W3 = model[1].weight.detach().clone(), model[3].weight.detach().clone()
    qm = quantize(model, "gptq:3:g8", calibration=cal, modules=["1", "3"])
    assert qm.names == ["1", "3"]
    with torch.no_grad():
        x1 = model[0](cal.reshape(-1, 8)).reshape(-1, 16)
        H1 = 2.0 / x1.shape[0] * x1.T @ x1
        torch.testing.assert_close(qm.model[1].weight, gptq_quantize(W1, H1, 3, 8).weight)
        x3 = torch.relu(qm.model[1](x1))  # layer 3 sees the already-quantized layer 1
        H3 = 2.0 / x3.shape[0] * x3.T @ x3
        torch.testing.assert_close(qm.model[3].weight, gptq_quantize(W3, H3, 3, 8).weight)

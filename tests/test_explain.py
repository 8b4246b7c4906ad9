"""losslens.measure.explain: blocks of an LM, the explanation of a quantizer against the exact Hessian, the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from losslens.geometry.operators.dense import exact_hessian
from losslens.geometry.base.params import literal_glob
from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.measure.explain import (
    BlockError,
    ExplainError,
    block_members,
    explain,
    explain_specs,
    explanations_frame,
    module_kind,
)
from losslens.measure.explain.direction import quantized_direction
from tests.tiny_models import micro_gptneox, micro_llama, random_batches


def test_block_members_layers_kinds_and_outside():
    model = micro_gptneox(seed=0)
    names = [n for n, _ in model.named_parameters()]
    layer = block_members(model, names, "layer")
    assert list(layer) == ["layer0", "layer1", "embeddings", "other"]
    assert layer["embeddings"] == ["gpt_neox.embed_in.weight", "lm_head.weight"]  # input and output embeddings
    assert layer["other"] == ["gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias"]
    kind = block_members(model, names, "kind")
    assert set(kind) == {"attention", "mlp", "norm", "embeddings", "other"}
    assert all(".attention." in n for n in kind["attention"]) and all("layernorm" in n for n in kind["norm"])
    lk = block_members(model, names, "layer_kind")
    assert "layer1.mlp" in lk and sum(map(len, lk.values())) == len(names)
    llama = micro_llama(seed=0)
    lin = [n for n, _ in llama.named_parameters() if n.endswith("proj.weight")]
    assert set(block_members(llama, lin, "kind")) == {"attention", "mlp"}  # self_attn -> attention
    assert module_kind("feed_forward") == "mlp" and module_kind("ln_1") == "norm" and module_kind("router") == "router"
    assert module_kind("post_attention_layernorm") == "norm"
    with pytest.raises(BlockError, match="unknown block partition"):
        block_members(model, names, "rows")
    with pytest.raises(BlockError, match="no parameter"):
        block_members(model, ["nope.weight"], "layer")


@pytest.fixture(scope="module")
def neox():
    model = micro_gptneox(seed=1)
    batches = random_batches(n_batches=2, batch=3, seq=8, seed=1)
    return model, batches


def test_explanation_equals_the_exact_hessian_of_the_quantized_matrices(neox):
    model, batches = neox
    delta, qm = quantized_direction(model, "rtn:2:row")
    names = list(delta)
    model.requires_grad_(True)
    H, space = exact_hessian(model, lm_loss, batches, params=[literal_glob(n) for n in names])
    assert list(space.names) == names
    d = space.flatten(delta)
    trace = float(torch.trace(H))
    # a trace budget >= dim gives the exact trace: κ equals its dense value
    e = explain(model, "rtn:2:row", batches, blocks="layer", within=True, trace_matvecs=space.dim)
    f = e.factors
    assert e.trace_source == "estimated" and e.attribution.trace.method == "exact"
    assert f.trace == pytest.approx(trace, rel=1e-5) and f.dim == space.dim == 256
    dHd = float(d @ H @ d)
    assert f.dHd == pytest.approx(dHd, rel=1e-5)
    assert f.kappa == pytest.approx(dHd / float(d @ d) / (trace / space.dim), rel=1e-5)
    # the measured change and the remainder are reported, on the same batches
    actual = evaluate(qm.model, batches).loss - evaluate(model, batches).loss
    assert f.actual == pytest.approx(actual, rel=1e-6) and f.remainder == pytest.approx(actual - f.predicted, abs=1e-9)
    assert e.rel_delta == pytest.approx(actual / evaluate(model, batches).loss, rel=1e-6)
    # blocks: each layer's part of δᵀHδ and its within-block part equal the dense ones; parts sum to totals
    frame = e.frame().set_index("block")
    assert list(frame.index) == ["layer0", "layer1"]
    for b in frame.index:
        idx = torch.cat(
            [torch.arange(space.slices[n].start, space.slices[n].stop) for n in names if f"layers.{b[5:]}." in n]
        )
        assert frame.loc[b, "dHd"] == pytest.approx(float(d[idx] @ (H @ d)[idx]), rel=1e-5)
        assert frame.loc[b, "within"] == pytest.approx(float(d[idx] @ H[idx][:, idx] @ d[idx]), rel=1e-5)
    assert math.fsum(frame["dHd"]) == pytest.approx(f.dHd, rel=1e-13)
    assert math.fsum(frame["gTd"]) == pytest.approx(f.gTd, rel=1e-12, abs=1e-15)
    assert math.fsum(frame["norm2"]) == pytest.approx(f.norm2, rel=1e-13)
    assert e.attribution.cross == pytest.approx(f.dHd - frame["within"].sum(), rel=1e-9)
    assert e.attribution.num_matvecs == 1 + 2 and e.trace_matvecs == space.dim
    json.dumps(e.to_dict())
    # the model is left as it was
    assert not model.training


def test_specs_share_one_trace_and_the_frame_compares_them(neox):
    model, batches = neox
    exps = explain_specs(model, ["rtn:3:row", "rtn:2:row", "int8"], batches, blocks="kind", trace_matvecs=9, seed=2)
    assert [e.spec for e in exps] == ["rtn:3:row", "rtn:2:row", "int8"]
    assert {e.trace_source for e in exps} == {"shared"} and len({e.factors.trace for e in exps}) == 1
    assert {e.partition for e in exps} == {"kind"} and set(exps[0].frame()["block"]) == {"attention", "mlp"}
    df = explanations_frame(exps)
    assert list(df["spec"]) == ["rtn:3:row", "rtn:2:row", "int8"] and df.loc[0, "log_kappa_ratio"] == 0
    ok = df["quadratic"] > 0
    assert (
        df.loc[ok, "log_quadratic_ratio"] - df.loc[ok, "log_norm2_ratio"] - df.loc[ok, "log_kappa_ratio"]
    ).abs().max() < 1e-12
    again = explain_specs(model, ["rtn:2:row"], batches, blocks="kind", trace=exps[0].attribution.trace)
    assert again[0].trace_source == "given" and again[0].factors.kappa == pytest.approx(
        exps[1].factors.kappa, rel=1e-12
    )


def test_refusals(neox, monkeypatch):
    model, batches = neox
    with pytest.raises(BlockError, match="unknown block partition"):
        explain(model, "rtn:2:row", batches, blocks="rows")
    with pytest.raises(ExplainError, match="trace method"):
        explain(model, "rtn:2:row", batches, trace_method="lanczos")
    with pytest.raises(ExplainError, match="no quantizer spec"):
        explain_specs(model, [], batches)
    from losslens.measure.explain import direction as measure

    real = measure.quantize

    def sneaky(m, spec, **kw):  # a quantizer that also moves a norm: δ would leave the quantized matrices
        qm = real(m, spec, **kw)
        with torch.no_grad():
            qm.model.gpt_neox.final_layer_norm.weight.add_(0.1)
        return qm

    monkeypatch.setattr(measure, "quantize", sneaky)
    with pytest.raises(ExplainError, match="outside the quantized weights"):
        explain(model, "rtn:2:row", batches)


def test_explain_command_prints_tables_and_writes_json(tmp_path):
    from losslens.cli.app import app
    from losslens.study.sweep.testing import tiny_trajectory

    traj = tiny_trajectory(tmp_path / "t", n=1, hidden=32, layers=2)
    ckpt = traj / "step-000100"
    data = traj / "data"
    out = tmp_path / "e.json"
    args = [
        "explain",
        str(ckpt),
        "--spec",
        "rtn:3:row",
        "--spec",
        "gptq:3:row",
        "--blocks",
        "kind",
        "--within",
        "--trace-hvps",
        "6",
        "--curvature-set",
        str(data / "curvature.safetensors"),
        "--calib-set",
        str(data / "calibration.safetensors"),
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "κ [95% CI]" in res.output and "gptq:3:row vs rtn:3:row" in res.output and "cross-block terms" in res.output
    got = json.loads(out.read_text())
    assert [e["spec"] for e in got["explanations"]] == ["rtn:3:row", "gptq:3:row"]
    e = got["explanations"][0]
    assert {"kappa", "kappa_ci_low", "kappa_ci_high", "remainder", "norm2", "trace_per_param", "blocks"} <= set(e)
    assert {b["block"] for b in e["blocks"]} == {"attention", "mlp"} and "within" in e["blocks"][0]
    res = CliRunner().invoke(
        app,
        args[:4]
        + [
            "--json",
            "--out",
            str(tmp_path / "j.json"),
            "--curvature-set",
            str(data / "curvature.safetensors"),
            "--trace-hvps",
            "6",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["explanations"][0]["spec"] == "rtn:3:row"
    bad = CliRunner().invoke(
        app, ["explain", str(ckpt), "--spec", "gptq:3:row", "--curvature-set", str(data / "curvature.safetensors")]
    )
    assert bad.exit_code == 2 and "cannot build or read the token sets" in bad.output  # no tokenizer, no --calib-set
    bad = CliRunner().invoke(
        app, args[:4] + ["--max-memory", "1MB", "--curvature-set", str(data / "curvature.safetensors")]
    )
    assert bad.exit_code == 2 and "max_memory" in bad.output  # refused before any work, with what it needs
    bad = CliRunner().invoke(app, ["explain", str(ckpt), "--spec", "rtn:9"])
    assert bad.exit_code != 0 and "bits" in bad.output
    bad = CliRunner().invoke(
        app,
        [
            "explain",
            str(ckpt),
            "--blocks",
            "rows",
            "--trace-hvps",
            "6",
            "--curvature-set",
            str(data / "curvature.safetensors"),
            "--calib-set",
            str(data / "calibration.safetensors"),
        ],
    )
    assert bad.exit_code == 2 and "unknown block partition" in bad.output

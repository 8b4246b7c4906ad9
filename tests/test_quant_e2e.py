"""End to end on a tiny trained checkpoint: error ordering, the original untouched, the CLI.

The checkpoint is a tiny GPT-NeoX trained here (80 full-batch AdamW steps, ~3 s) on sequences of
a noisy permutation chain, *to a near minimum of the evaluation loss itself* (the evaluation set
is its training set): there the gradient is ~0 and ΔQ L ≈ ½ δᵀHδ > 0 grows with the weight
perturbation, so the orderings below are properties of the quantizers, not of evaluation noise.
(On a model far from a minimum of the evaluation loss first-order terms of random sign dominate
small quantization errors.) The calibration set is drawn separately and is disjoint.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from losslens.lm.core.next_token_loss import evaluate, lm_loss
from losslens.lm.quant import CalibrationError, QuantError, quantization_error
from losslens.lm.core.tokenset import TokenSet

V, HIDDEN = 128, 32


def chain(n, b, s, seed, noise=0.15):
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(V, generator=torch.Generator().manual_seed(1234))
    out = torch.empty(n * b, s, dtype=torch.long)
    out[:, 0] = torch.randint(0, V, (n * b,), generator=g)
    for t in range(1, s):
        rnd = torch.rand(n * b, generator=g) < noise
        out[:, t] = torch.where(rnd, torch.randint(0, V, (n * b,), generator=g), succ[out[:, t - 1]])
    return out.reshape(n, b, s)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=V,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=64,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(cfg)
    ev = TokenSet(chain(2, 16, 32, seed=200), name="eval")
    cal = TokenSet(chain(8, 8, 32, seed=300), name="calibration")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    steps = 80
    for i in range(steps):
        for group in opt.param_groups:
            group["lr"] = 1e-2 * min(1.0, (i + 1) / 10, (steps - i) / (0.5 * steps))
        loss = sum(lm_loss(model, b) for b in ev) / len(ev)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    from losslens.lm.train.run_files import save_checkpoint

    folder = tmp_path_factory.mktemp("ckpt") / "step-000080"
    save_checkpoint(folder, model, None)  # config.json + model.safetensors, as the project writes them
    ev.save(folder.parent / "eval.safetensors")
    cal.save(folder.parent / "calib.safetensors")
    return model, ev, cal, folder


def test_error_ordering_and_fields(trained):
    model, ev, cal, _ = trained
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fp = evaluate(model, ev)
    assert fp.loss < 0.1  # trained to a near minimum of this set
    specs = ["int8", "rtn:4:g32", "rtn:3:g32", "gptq:4:g32", "gptq:3:g32", "rtn:3:row", "gptq:3:row"]
    res = {s: quantization_error(model, s, ev, calibration=cal, fp_loss=fp) for s in specs}
    d = {s: r.rel_loss_error for s, r in res.items()}
    assert 0 < d["int8"] < d["rtn:4:g32"] < d["rtn:3:g32"]
    assert d["gptq:4:g32"] <= d["rtn:4:g32"]
    assert d["gptq:3:g32"] <= d["rtn:3:g32"]
    assert d["gptq:3:row"] <= d["rtn:3:row"]
    for s, r in res.items():
        assert isinstance(r, QuantError) and r.spec == s
        assert r.fp_loss == pytest.approx(fp.loss)
        assert r.rel_loss_error == pytest.approx(r.q_loss / r.fp_loss - 1, rel=1e-12)
        assert r.ppl_gap == pytest.approx(math.exp(r.q_loss - r.fp_loss) - 1, rel=1e-9)
        assert r.q_ppl == pytest.approx(math.exp(r.q_loss)) and r.fp_ppl == pytest.approx(math.exp(r.fp_loss))
        assert len(r.layer_errors) == 8 and all(0 < e < 1 for e in r.layer_errors.values())
        assert math.isfinite(r.kurtosis) and r.seconds > 0 and r.n_tokens == ev.n_targets
        json.dumps(r.to_dict())
    # weight errors follow the bits
    mean = lambda s: sum(res[s].layer_errors.values()) / 8  # noqa: E731
    assert mean("int8") < mean("rtn:4:g32") < mean("rtn:3:g32")
    # the original model is untouched
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    # without fp_loss the FP loss is computed (same number)
    again = quantization_error(model, "rtn:4:g32", ev)
    assert again.fp_loss == pytest.approx(fp.loss, rel=1e-6) and again.q_loss == pytest.approx(
        res["rtn:4:g32"].q_loss, rel=1e-6
    )


def test_bad_data(trained):
    model, ev, cal, _ = trained
    with pytest.raises(CalibrationError, match="also appear in the calibration set"):
        quantization_error(model, "gptq:4:g32", ev, calibration=ev)
    with pytest.raises(CalibrationError, match="needs calibration"):
        quantization_error(model, "gptq:4:g32", ev)


def test_cli_json_and_table(trained):
    from typer.testing import CliRunner

    from losslens.cli.app import app

    model, ev, cal, folder = trained
    runner = CliRunner()
    args = [
        "quantize",
        str(folder),
        "--spec",
        "int8",
        "--spec",
        "rtn:4:g32",
        "--spec",
        "gptq:4:g32",
        "--spec",
        "awq:4:g32",
        "--eval-set",
        str(folder.parent / "eval.safetensors"),
        "--calib-set",
        str(folder.parent / "calib.safetensors"),
    ]
    out = runner.invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["spec"] for r in rows] == ["int8", "rtn:4:g32", "gptq:4:g32", "awq:4:g32"]
    for r in rows:
        for k in ("fp_loss", "q_loss", "rel_loss_error", "ppl_gap"):
            assert isinstance(r[k], float)
        assert r["rel_loss_error"] == pytest.approx(r["q_loss"] / r["fp_loss"] - 1)
        assert r["eval_hash"] == ev.content_hash
    assert rows[2]["calib_hash"] == cal.content_hash and rows[0]["calib_hash"] is None
    want = quantization_error(model, "gptq:4:g32", ev, calibration=cal)
    assert rows[2]["q_loss"] == pytest.approx(want.q_loss, rel=1e-5)
    # AWQ states what it optimised (issue #12): its calibration output error relative to RTN's, <= 1
    awq = quantization_error(model, "awq:4:g32", ev, calibration=cal)
    assert rows[3]["calib_objective_ratio"] == pytest.approx(awq.calib_objective_ratio, rel=1e-9)
    assert 0 < rows[3]["calib_objective_ratio"] <= 1 and all(r["calib_objective_ratio"] is None for r in rows[:3])
    table = runner.invoke(
        app,
        args[:2]
        + ["--spec", "rtn:4:g32", "--spec", "gptq:4:g32", "--spec", "awq:4:g32"]
        + args[-4:]
        + ["--calib-batches", "4"],
    )
    assert table.exit_code == 0, table.output
    assert "rtn:4:g32" in table.stdout and "gptq:4:g32" in table.stdout and "ΔQ L" in table.stdout
    assert "awq:4:g32: calibration output error" in table.stdout and "AWQ can be worse than RTN" in table.stdout
    bad = runner.invoke(app, ["quantize", str(folder), "--spec", "rtn:9:g32"])
    assert bad.exit_code != 0 and "2..8" in bad.output
    tiny_cal = TokenSet(cal.tokens[:2, :1], name="tiny").save(folder.parent / "tiny_calib.safetensors")
    short = runner.invoke(
        app, args[:2] + ["--spec", "gptq:4:g32", "--eval-set", args[-3], "--calib-set", str(tiny_cal), "--json"]
    )
    assert short.exit_code == 2 and "calibration too short" in short.output
    missing = runner.invoke(app, ["quantize", str(folder.parent / "nope"), "--spec", "int8"])
    assert missing.exit_code != 0


def test_cli_default_token_sets(tmp_path):
    """A checkpoint with its tokenizer (helper C's tiny trainer): default held-out token sets."""
    from typer.testing import CliRunner

    from losslens.cli.app import app
    from losslens.lm.train.config import TrainConfig
    from losslens.lm.train.tiny import train_tiny

    traj = train_tiny(TrainConfig.tiny(steps=4, checkpoints=1), tmp_path / "run", progress=False)
    ckpt = traj.checkpoints[-1].location
    out = CliRunner().invoke(
        app, ["quantize", ckpt, "--spec", "rtn:4:g32", "--spec", "gptq:4:g32", "--quick", "--json"]
    )
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["spec"] for r in rows] == ["rtn:4:g32", "gptq:4:g32"]
    assert all(math.isfinite(r["ppl_gap"]) for r in rows)

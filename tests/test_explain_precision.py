"""Issue #35: `explain` measures its Hessian products' error and shows it. With half-precision
compute and gradient differences the explanation carries ``hvp_check`` and ``error_warning`` (the
error, its cause, the fix) and the CLI prints one ``warning:`` line (``--strict``: exit 1); with the
default float32 compute it carries the measured error and no warning."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from losslens.measure.explain import explain_specs


def _model_and_batches():
    from losslens.lm.models.families import tiny_model

    model = tiny_model("llama", seed=5, dtype=torch.bfloat16)
    weight = model.get_input_embeddings().weight
    ids = (weight.abs().sum(1) != 0).nonzero().reshape(-1)  # tokens whose embedding row is not zero
    g = torch.Generator().manual_seed(205)
    return model, [ids[torch.randint(0, len(ids), (2, 16), generator=g)] for _ in range(2)]


def test_half_compute_flags_the_explanation_and_float32_does_not():
    model, batches = _model_and_batches()
    kw = dict(trace_matvecs=3, trace_method="hutchinson", backend="difference")
    (half,) = explain_specs(model, ["rtn:4:row"], batches, compute_dtype="bfloat16", **kw)
    check = half.hvp_check
    assert check["compute_dtype"] == "bfloat16" and check["rel_error"] > 1e-2
    warning = half.error_warning
    assert warning["rel_error"] == check["rel_error"] and warning["tolerance"] == 1e-2
    assert warning["cause"] == "half-precision compute (bfloat16)" and "--compute-dtype float32" in warning["fix"]
    assert half.to_dict()["error_warning"]["message"] == warning["message"]
    (loose,) = explain_specs(model, ["rtn:4:row"], batches, compute_dtype="bfloat16", error_tolerance=10.0, **kw)
    assert loose.hvp_check["rel_error"] > 1e-2 and loose.error_warning is None  # measured, within a loose tolerance
    (default,) = explain_specs(model, ["rtn:4:row"], batches, **kw)  # float32 compute of the bfloat16 weights
    assert default.hvp_check["compute_dtype"] == "float32" and default.hvp_check["rel_error"] <= 1e-2
    assert default.error_warning is None
    (exact,) = explain_specs(model, ["rtn:4:row"], batches, trace_matvecs=3, trace_method="hutchinson")
    assert exact.hvp_check is None and exact.error_warning is None  # reverse products: nothing to measure


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from losslens.study.sweep.testing import tiny_trajectory

    traj = tiny_trajectory(tmp_path_factory.mktemp("t"), n=1, hidden=32, layers=2)
    return traj / "step-000100", traj / "data" / "curvature.safetensors"


def _explain(checkpoint, tmp_path, *extra):
    from losslens.cli.app import app

    ckpt, curvature = checkpoint
    out = tmp_path / "e.json"
    args = ["explain", str(ckpt), "--spec", "rtn:4:row", "--trace-hvps", "3", "--trace-method", "hutchinson"]
    args += ["--curvature-set", str(curvature), "--out", str(out), "--backend", "difference", *extra]
    res = CliRunner().invoke(app, args)
    return res, json.loads(out.read_text())


def test_the_command_prints_the_warning_and_strict_exits_1(checkpoint, tmp_path):
    res, got = _explain(checkpoint, tmp_path, "--compute-dtype", "bfloat16")
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "half-precision compute (bfloat16)" in lines[0] and "--compute-dtype float32" in lines[0]
    assert got["error_warning"]["rel_error"] == got["hvp_check"]["rel_error"] > 1e-2
    assert got["explanations"][0]["error_warning"]["message"] == lines[0].removeprefix("warning: ")
    assert "measured relative error" in res.stdout  # the tables say it too
    strict, _ = _explain(checkpoint, tmp_path, "--compute-dtype", "bfloat16", "--strict")
    assert strict.exit_code == 1 and "warning:" in strict.stderr
    default, got = _explain(checkpoint, tmp_path, "--strict")  # float32 weights, float32 compute
    assert default.exit_code == 0, default.output
    assert "warning:" not in default.stderr and got["error_warning"] is None
    assert got["hvp_check"]["rel_error"] <= 1e-2

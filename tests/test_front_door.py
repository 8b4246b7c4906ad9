"""`import losslens` is the Python API: light to import, every public name resolves, and each command
function returns what its command prints under ``--json`` (same keys, values equal after a JSON round
trip: the runs are deterministic on CPU). Left out of each comparison, and said so per case: wall
times (``seconds``, ``quant_seconds``, ``data_seconds``, per-checkpoint and per-probe seconds)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import warnings

import pytest
from typer.testing import CliRunner

import losslens
from losslens.cli.app import app
from losslens.lm.shared_settings import ComputeOptions, MemoryOptions
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory

COMMANDS = ("sharpness", "quantize", "explain", "sweep", "report", "accuracy", "landscape", "surface")
"""The command functions of the front door (each compared with its CLI below)."""
WALL_TIMES = {"seconds", "quant_seconds", "data_seconds", "checkpoint_seconds", "probe_seconds", "points_per_second"}


def _drop_times(x):
    """``x`` without its wall-time entries (they differ between two runs), recursively."""
    if isinstance(x, dict):
        return {k: _drop_times(v) for k, v in x.items() if k not in WALL_TIMES}
    if isinstance(x, list):
        return [_drop_times(v) for v in x]
    return x


def _same(by_call, by_cli) -> None:
    a, b = _drop_times(json.loads(json.dumps(by_call))), _drop_times(by_cli)
    assert a == b


def _cli_json(args: list[str]):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("front") / "tiny", n=2, seed=3)


def test_import_is_light_and_every_name_resolves():
    """In a fresh interpreter: ``import losslens`` and ``print(losslens.sharpness)`` (and every other
    command function) leave torch unimported; then every name of ``__all__`` resolves."""
    code = (
        "import sys, losslens\n"
        f"for n in {COMMANDS!r}: print(getattr(losslens, n))\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "import losslens.geometry.base.errors, losslens.geometry\n"
        "assert 'torch' not in sys.modules, 'torch imported by losslens.geometry'\n"
        "missing = [n for n in losslens.__all__ if getattr(losslens, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert set(losslens.__all__) <= set(dir(losslens))\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
    with pytest.raises(AttributeError):
        losslens.no_such_name  # noqa: B018


def test_defaults_come_from_the_settings_objects():
    """A front-door function's keyword parameters are the CLI's option names with the settings
    objects' defaults; the torch-free default backend is the operators' default."""
    from losslens.geometry.operators.names import DEFAULT_BACKEND

    params = inspect.signature(losslens.sharpness).parameters
    assert params["max_memory"].default == MemoryOptions().max_memory
    assert params["backend"].default == ComputeOptions().backend == DEFAULT_BACKEND
    assert {"quick", "seed", "device", "threads", "label", "error_tolerance"} <= set(params)
    assert inspect.signature(losslens.sweep).parameters["backend"].default is None  # the plan's backend
    with pytest.raises(TypeError, match="unexpected"):
        losslens.sharpness("x", no_such_option=1)


def test_sharpness_equals_the_cli(traj):
    """losslens.sharpness(ckpt, quick=True, seed=1, ...) == `losslens sharpness ckpt --quick --seed 1 ... --json`
    (wall times left out)."""
    data = str(traj / "data" / "curvature.safetensors")
    opts = dict(label="step-000100", num_matvecs=3, max_iter=5, data=data, threads=1, seed=1, quick=True)
    by_call = losslens.sharpness(str(traj), strict_memory=False, **opts)
    args = ["sharpness", str(traj), "--label", "step-000100", "--num-matvecs", "3", "--max-iter", "5"]
    args += ["--data", data, "--threads", "1", "--seed", "1", "--quick", "--no-strict-memory", "--json"]
    _same(by_call, json.loads(_cli_json(args)))
    assert by_call["trace"]["seed"] == 1


def test_quantize_equals_the_cli(traj):
    """losslens.quantize(...) == `losslens quantize ... --json` (one row per spec; wall times left out)."""
    ev = str(traj / "data" / "eval.safetensors")
    by_call = losslens.quantize(str(traj), spec=["rtn:4:g32", "int8"], eval_set=ev, eval_batches=1)
    out = _cli_json(
        ["quantize", str(traj), "-s", "rtn:4:g32", "-s", "int8", "--eval-set", ev, "--eval-batches", "1", "--json"]
    )
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["spec"] for r in by_call] == ["rtn:4:g32", "int8"]
    _same(by_call, rows)


def test_explain_equals_the_cli(traj, tmp_path):
    """losslens.explain(...) == `losslens explain ... --json` (wall times left out; --out is the CLI's)."""
    curv = str(traj / "data" / "curvature.safetensors")
    opts = dict(spec=["rtn:3:row"], trace_hvps=3, curvature_set=curv, threads=1, seed=2)
    by_call = losslens.explain(str(traj), strict_memory=False, **opts)
    args = ["explain", str(traj), "-s", "rtn:3:row", "--trace-hvps", "3", "--curvature-set", curv, "--threads", "1"]
    args += ["--seed", "2", "--no-strict-memory", "--out", str(tmp_path / "e.json"), "--json"]
    out = _cli_json(args)
    _same(by_call, json.loads(out[out.index("{") :]))
    assert by_call["explanations"][0]["spec"] == "rtn:3:row"


def test_sweep_and_report_equal_the_cli(traj, tmp_path):
    """losslens.sweep(...) and losslens.report(...) == their commands' --json (a second sweep of the
    two stores of the same plan; wall times, the store's and the page's paths left out)."""
    plan = tiny_plan_toml(tmp_path / "plan.toml", traj, probes="loss = true\n")
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    by_call = losslens.sweep(str(traj), out=a, plan=plan, quiet=True, threads=1, device="cpu")
    out = _cli_json(["sweep", str(traj), "--out", str(b), "--plan", str(plan), "-q", "--threads", "1", "--json"])
    by_cli = json.loads(out[out.index("{") :])
    assert by_call["n_ok"] == by_cli["n_ok"] == 2 and by_call["exit_code"] == 0
    by_call.pop("store"), by_cli.pop("store")
    _same(by_call, by_cli)
    rep = losslens.report(a, out=tmp_path / "a.html", n_boot=40)
    out = _cli_json(["report", str(b), "--out", str(tmp_path / "b.html"), "--n-boot", "40", "--json"])
    by_cli = json.loads(out)
    assert rep.pop("path").endswith("a.html") and by_cli.pop("path").endswith("b.html")
    assert rep == by_cli and rep["checkpoints"] == 2 and rep["rows"] >= 2


def test_accuracy_equals_the_cli():
    """losslens.accuracy(...) == `losslens accuracy ... --json` (one record per (variant, task) and mean)."""
    from tests.fixtures_trajectory import tiny_trajectory_dir

    ck = str(tiny_trajectory_dir(seq_len=64) / "step-000060")
    by_call = losslens.accuracy(ck, spec=["rtn:2:g32"], limit=8, n_boot=20, seed=3)
    args = ["accuracy", ck, "--spec", "rtn:2:g32", "--limit", "8", "--n-boot", "20", "--seed", "3", "--json"]
    rows = [json.loads(line) for line in _cli_json(args).splitlines() if line.startswith("{")]
    assert [(r["variant"], r["task"]) for r in by_call][-1] == ("rtn:2:g32", "mean") and "delta_acc" in by_call[-1]
    _same(by_call, rows)


def test_landscape_equals_the_cli(tmp_path):
    """losslens.landscape(...) == `losslens landscape ... --json` (both write their page)."""
    from tests.fixtures_trajectory import tiny_trajectory_dir

    folder = str(tiny_trajectory_dir())
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    by_call = losslens.landscape([folder], spec="rtn:2:g32", grid=3, quick=True, out=a, quiet=True)
    args = ["landscape", folder, "-s", "rtn:2:g32", "--grid", "3", "--quick", "--out", str(b), "-q", "--json"]
    _same(by_call, json.loads(_cli_json(args)))
    assert len(by_call["quantized"]) == 3 and a.is_file() and b.is_file()


def test_surface_equals_the_cli(traj, tmp_path):
    """losslens.surface(...) == the Surface `losslens surface ... --json FILE` writes (wall times and
    points per second left out); B defaults to the checkpoint before A."""
    ev = str(traj / "data" / "eval.safetensors")
    by_call = losslens.surface(str(traj), spec="rtn:4:g32", grid=3, data=ev, quiet=True)
    js = tmp_path / "s.json"
    args = ["surface", str(traj), "-s", "rtn:4:g32", "--grid", "3", "--data", ev, "-q", "--json", str(js)]
    _cli_json(args + ["--out", str(tmp_path / "s.html")])
    _same(by_call, json.loads(js.read_text()))
    assert set(by_call["points"]) == {"A", "B", "C"} and len(by_call["loss"]) == 3


def test_a_library_warning_is_a_losslens_warning(traj):
    """A flagged result (products' measured error over the tolerance) warns with a LosslensWarning
    subclass, which ``warnings.simplefilter("error")`` turns into an exception."""
    data = str(traj / "data" / "curvature.safetensors")
    opts = dict(label="step-000100", num_matvecs=3, max_iter=3, data=data, threads=1, strict_memory=False)
    opts.update(backend="difference", error_tolerance=1e-300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = losslens.sharpness(str(traj), **opts)
    assert res["error_warning"] is not None
    ours = [w for w in caught if issubclass(w.category, losslens.LosslensWarning)]
    assert ours, [str(w.message) for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(losslens.LosslensWarning):
            losslens.sharpness(str(traj), **opts)

"""Issue #46 item 3: `losslens bench`'s suite, settings and checks live in the library
(:mod:`losslens.study.bench_suite`); its refusals come from :func:`run_bench` before any benchmark runs,
saying what to change, and the command prints them as typer's usage error."""

from __future__ import annotations

import inspect
import json
import types

import pytest
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.study import bench_suite
from losslens.study.bench_suite import BenchError, BenchSettings, bench_names, run_bench


@pytest.mark.parametrize(
    "names, settings, says",
    [
        ("nope", BenchSettings(), "unknown benchmark 'nope'; choose from hvp_throughput,"),
        (("solvers", "nope"), BenchSettings(), "unknown benchmark 'nope'"),
        ("hvp", BenchSettings(markdown_out="x.md"), "--markdown applies to the gpu and real_model benchmarks only"),
        ("hvp", BenchSettings(device="cpu"), "--device and --budget apply to the gpu benchmark only"),
        ("all", BenchSettings(budget=10.0), "not 'hvp_throughput'"),
        ("gpu", BenchSettings(gguf="smol.gguf"), "--gguf to real_model, not 'gpu'"),
    ],
)
def test_the_library_refuses_before_any_benchmark_runs(names, settings, says, monkeypatch):
    ran, lines = [], []
    real_load = bench_suite.load_benchmark

    def load(name):  # the real module (its run's signature is checked), its run never called
        module = real_load(name)
        return types.SimpleNamespace(run=_recording(module.run, ran))

    monkeypatch.setattr(bench_suite, "load_benchmark", load)
    with pytest.raises(BenchError) as err:
        run_bench(names, settings, echo=lines.append)
    assert says in str(err.value)
    assert ran == [] and lines == []


def _recording(run, ran):
    def wrapper(**kwargs):
        ran.append(kwargs)
        return []

    wrapper.__signature__ = inspect.signature(run)
    return wrapper


def test_names_all_and_aliases():
    assert bench_names("all") == bench_suite.SUITE and "real_model" not in bench_names("all")
    assert bench_names("hvp") == ("hvp_throughput",) and bench_names("real_model") == ("real_model",)


def test_the_run_in_order_with_its_files(tmp_path, monkeypatch):
    def fake(name, table):
        def run(quick=False, device=None, budget=None):
            return [{"name": name, "quick": quick, "device": device}]

        module = types.SimpleNamespace(run=run, markdown=lambda rows: f"| {name} |")
        if table:
            module.terminal_table = lambda rows: f"table of {name}"
        return module

    monkeypatch.setattr(bench_suite, "load_benchmark", lambda n: fake(n, n == "gpu"))
    lines, shown = [], []
    s = BenchSettings(quick=True, device="cpu", markdown_out=tmp_path / "g.md", json_out=tmp_path / "all.json")
    rows = run_bench(("gpu", "statistics"), s, echo=lines.append, show=shown.append)
    assert lines == [
        "== benchmark gpu (quick)",
        f"wrote {tmp_path / 'g.md'}",
        "== benchmark statistics (quick)",
        f"wrote {tmp_path / 'g.md'}",
        f"wrote {tmp_path / 'all.json'}",
    ]
    assert [(r.name, r.table) for r in shown] == [("gpu", "table of gpu"), ("statistics", None)]
    assert rows["gpu"] == [{"name": "gpu", "quick": True, "device": "cpu"}]
    assert json.loads((tmp_path / "all.json").read_text()) == rows
    assert (tmp_path / "g.md").read_text() == "| statistics |\n"


def test_the_command_prints_the_refusal_as_a_usage_error():
    res = CliRunner().invoke(app, ["bench", "hvp", "--device", "cpu"])
    assert res.exit_code == 2 and "--device and --budget apply to the gpu benchmark only" in res.output
    assert "== benchmark" not in res.output  # refused before any benchmark ran

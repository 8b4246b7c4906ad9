"""Commands are plain functions: called from Python (no CLI runner) they do what the CLI does, and
the option groups shared by `sweep`, `sharpness` and `explain` are declared once."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from losslens.cli.app import app
from losslens.cli.option_parsing import cli, flag_of, option, option_of
from losslens.cli.option_groups import (
    device_help,
    CheckpointOptions,
    ComputeOptions,
    ErrorOptions,
    LoadOptions,
    MemoryOptions,
    QUIET_HELP,
    TrajectoryOptions,
    threads_help,
)
from losslens.cli.explain_command import explain
from losslens.cli.sharpness_command import sharpness
from losslens.cli.sweep_command import SWEEP_HELP, sweep
from losslens.measure.sharpness import SharpnessSettings
from losslens.study.trajectory_sweep import SweepSettings
from losslens.study.sweep import Store
from losslens.study.sweep.testing import tiny_plan_toml, tiny_trajectory


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    return tiny_trajectory(tmp_path_factory.mktemp("traj") / "tiny", n=2, seed=3)


def _json(text: str) -> dict:
    return json.loads(text[text.index("{") :])


def test_sharpness_called_as_a_function_equals_the_cli(traj, capsys):
    """The same checkpoint and options, once through `losslens sharpness` and once as a Python call
    with the option groups: the same trace, eigenvalue, memory plan and settings."""
    data = str(traj / "data" / "curvature.safetensors")
    ckpt = str(traj)
    r = CliRunner().invoke(
        app,
        [
            "sharpness",
            ckpt,
            "--label",
            "step-000100",
            "--num-matvecs",
            "3",
            "--data",
            data,
            "--threads",
            "1",
            "--max-iter",
            "5",
            "--max-memory",
            "64MB",
            "--no-strict-memory",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    by_cli = _json(r.output)
    sharpness(
        ckpt,
        source=CheckpointOptions(label="step-000100"),
        settings=SharpnessSettings(num_matvecs=3, data=data, max_iter=5),
        memory=MemoryOptions(max_memory="64MB", strict_memory=False),
        compute=ComputeOptions(threads=1),
        as_json=True,
    )
    by_call = _json(capsys.readouterr().out)
    assert by_call["checkpoint"] == by_cli["checkpoint"] == "step-000100"
    for part in ("trace", "eigen"):
        for d in (by_cli, by_call):
            d[part].pop("seconds")
        assert by_call[part] == by_cli[part]
    assert {k: v for k, v in by_call.items() if k != "seconds"} == {k: v for k, v in by_cli.items() if k != "seconds"}
    # a bad option fails the same way from Python: the CLI's one-line error and exit status 2
    with pytest.raises(typer.Exit) as exc:
        sharpness(ckpt, source=CheckpointOptions(label="step-000999"), settings=SharpnessSettings(data=data))
    assert exc.value.exit_code == 2 and "step-000999" in capsys.readouterr().err


def test_sweep_called_as_a_function_writes_the_store(traj, tmp_path, capsys):
    """`sweep` from Python: the plan's backend unless ComputeOptions names one (its default instance
    says backend=None), one row per checkpoint and probe, the summary printed."""
    plan = tiny_plan_toml(
        tmp_path / "plan.toml", traj, probes='loss = true\ntrace = { method = "hutchinson", num_matvecs = 2 }\n'
    )
    out = tmp_path / "r.sqlite"
    sweep(
        str(traj),
        settings=SweepSettings(out=out, plan=plan, quiet=True),
        compute=ComputeOptions(backend=None, threads=1),
        load=LoadOptions(device="cpu"),
    )
    assert "2 checkpoints, 4 rows: 4 ok, 0 failed" in capsys.readouterr().out
    with Store(out) as st:
        df = st.results()
    assert set(df["probe"]) == {"loss", "trace"} and (df["status"] == "ok").all()
    assert inspect.signature(sweep).parameters["compute"].default == ComputeOptions(backend=None)


def test_shared_options_come_from_one_declaration():
    """`sweep --help` and `sharpness --help` list the group fields with the group's flags and checks;
    a command's defaults come from its group instance, and help texts only where it gives its own."""
    groups = (TrajectoryOptions, LoadOptions, MemoryOptions, ComputeOptions)
    ours = {f.name for g in groups for f in dataclasses.fields(g)}
    sw = inspect.signature(cli(sweep, help=SWEEP_HELP)).parameters
    sh = inspect.signature(cli(sharpness)).parameters
    assert ours <= set(sw) and ours | {"label"} <= set(sh)
    assert not {"source", "load", "memory", "compute"} & (set(sw) | set(sh))
    for name in ours:  # the same typer.Option object's names and settings in both
        a, b = sw[name].annotation.__metadata__[0], sh[name].annotation.__metadata__[0]
        assert (a.default, a.param_decls, a.min) == (b.default, b.param_decls, b.min)
    assert sw["backend"].default is None and sh["backend"].default == "reverse"  # ComputeOptions(backend=None)
    assert sw["max_memory"].annotation.__metadata__[0].help == SWEEP_HELP["max_memory"]
    assert sh["max_memory"].annotation.__metadata__[0].help == flag_of(MemoryOptions, "max_memory").help
    ex = inspect.signature(cli(explain, help={"max_memory": "x"})).parameters
    assert ex["backend"].annotation.__metadata__[0].param_decls == sh["backend"].annotation.__metadata__[0].param_decls
    for f in dataclasses.fields(ErrorOptions):  # --error-tolerance and --strict: one declaration for both
        assert ex[f.name].annotation.__metadata__[0].param_decls == flag_of(ErrorOptions, f.name).param_decls
        assert ex[f.name].default == sh[f.name].default == f.default
    assert option_of(CheckpointOptions, "label", help="h").help == "h"
    assert option_of(CheckpointOptions, "label").help != "h"  # a copy: the group's declaration is unchanged


def _params(group=None):
    """(command name, click parameter) of every command of the app, subcommands included."""
    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        yield from (((name, p) for p in cmd.params) if not hasattr(cmd, "commands") else _params(cmd))


def test_quiet_and_threads_are_declared_once_with_each_commands_default():
    """Issue #46 item 3: every command with -q/--quiet or --threads takes the one declaration in
    option_groups (same flags, help, check), keeping its own default; no command module declares them."""
    quiet = {c: p for c, p in _params() if "--quiet" in p.opts}
    threads = {c: p for c, p in _params() if "--threads" in p.opts}
    assert {"sharpness", "sweep", "explain", "quantize", "accuracy", "demo", "fork", "compare-forks"} <= set(quiet)
    assert {"sharpness", "sweep", "explain", "demo", "train-tiny", "fork", "compare-forks"} <= set(threads)
    for c, p in quiet.items():
        assert (sorted(p.opts), p.secondary_opts, p.default, p.help) == (["--quiet", "-q"], [], False, QUIET_HELP), c
    for c, p in threads.items():
        assert p.opts == ["--threads"] and p.min == 0 and not p.show_default, c
        assert p.help.startswith(threads_help("").removesuffix(").")), c
    assert {c: p.default for c, p in threads.items() if p.default is not None} == {"demo": 1}  # the rest: None
    assert threads["sweep"].help == threads_help("auto") and threads["sharpness"].help == threads_help("torch's")
    root = Path(__file__).resolve().parents[1] / "probes" / "cli"
    flags = ('"--quiet"', '"--threads"', '"--device"')
    declared = [f.name for f in root.glob("*.py") if any(flag in f.read_text() for flag in flags)]
    assert declared == ["option_groups.py"]


def test_device_is_declared_once_with_each_commands_default():
    """Issue #46 item 3: ``--device`` is one declaration (option_groups.device_option), its help naming
    each command's own default."""
    devices = {c: p for c, p in _params() if "--device" in p.opts}
    assert {"sharpness", "explain", "quantize", "accuracy", "surface"} <= set(devices)
    for c, p in devices.items():
        assert p.opts == ["--device"] and p.default is None, c
        if c != "bench":  # bench reuses LoadOptions' declaration with its own help (the GPU check's device)
            assert p.help.startswith(device_help("").split("(default")[0]), c
    assert devices["quantize"].help == device_help("cpu") and devices["explain"].help == device_help(
        "cuda when available"
    )


@dataclasses.dataclass(frozen=True)
class Group:
    label: Optional[str] = option(None, "--label")


def test_cli_refuses_clashing_or_unknown_options():
    def twice(label: Annotated[Optional[str], typer.Option("--other")] = None, *, group: Group = Group()) -> None:
        return None

    with pytest.raises(TypeError, match="declared twice"):
        cli(twice)

    def once(*, group: Group = Group()) -> Group:
        return group

    with pytest.raises(TypeError, match="in none of its groups"):
        cli(once, help={"lable": "typo"})
    assert cli(once)(label="x") == Group(label="x")  # the flat CLI values come back as one group

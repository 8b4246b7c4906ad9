"""The namespace check (probes/_namespace.py): another distribution owning ``geometry`` or ``probes``,
or another ``geometry`` folder first on sys.path, is reported from ``import probes`` and from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from probes._namespace import NamespaceClashWarning, namespace_clashes, warn_on_clash

ROOT = Path(__file__).resolve().parents[1]


def _fake_distribution(site: Path, name: str = "fakegeo", top_level: str = "geometry", record: bool = False) -> None:
    """A distribution ``name`` 1.0 that installs the top-level package ``top_level`` (what pip leaves
    behind for another project called geometry): declared by ``top_level.txt``, or only by ``RECORD``."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if record:
        (info / "RECORD").write_text(f"{top_level}/__init__.py,,\n{name}-1.0.dist-info/METADATA,,\n")
    else:
        (info / "top_level.txt").write_text(f"{top_level}\n")


def _env(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in paths] + [str(ROOT)])
    env.pop("PYTHONWARNINGS", None)
    return env


def test_no_clash_here():
    assert namespace_clashes() == []


@pytest.mark.parametrize("top_level", ["geometry", "probes"])
def test_another_owner_is_a_clash(top_level):
    lines = namespace_clashes(
        {"geometry": ["losslens", "geometry-lib"], "probes": ["losslens"]}
        if top_level == "geometry"
        else {"geometry": ["losslens"], "probes": ["probes", "losslens"]}
    )
    assert len(lines) == 1
    other = "geometry-lib" if top_level == "geometry" else "probes"
    assert f"'{top_level}'" in lines[0] and other in lines[0] and "pip uninstall" in lines[0] and "\n" not in lines[0]
    # losslens alone (any spelling of its name) is no clash
    assert namespace_clashes({"geometry": ["losslens", "LossLens"], "probes": ["losslens"]}) == []


@pytest.mark.parametrize("record", [False, True], ids=["top_level.txt", "RECORD"])
def test_fake_distribution_owning_geometry_is_found(tmp_path, monkeypatch, record):
    _fake_distribution(tmp_path, record=record)
    monkeypatch.syspath_prepend(str(tmp_path))
    lines = namespace_clashes()
    assert len(lines) == 1 and "fakegeo" in lines[0] and "'geometry'" in lines[0]
    with pytest.warns(NamespaceClashWarning, match="fakegeo"):
        warn_on_clash()


def test_import_probes_and_the_cli_warn(tmp_path):
    _fake_distribution(tmp_path)
    env = _env(tmp_path)
    out = subprocess.run([sys.executable, "-c", "import probes"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "NamespaceClashWarning" in out.stderr and "fakegeo" in out.stderr and "pip uninstall" in out.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "probes.cli", "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert "fakegeo" in cli.stderr and cli.stdout.strip() == "0.1.0"
    # the same commands without the fake distribution say nothing
    clean = subprocess.run(
        [sys.executable, "-m", "probes.cli", "--version"], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert clean.returncode == 0 and clean.stderr == "", clean.stderr


def test_shadowing_geometry_folder_is_a_clash(tmp_path):
    """An editable install of another 'geometry' (or a folder of that name) first on sys.path declares
    no files in its RECORD, so only the location check can see it."""
    (tmp_path / "geometry").mkdir()
    (tmp_path / "geometry" / "__init__.py").write_text("")
    # probes from the source tree, geometry from tmp_path: not side by side
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import probes._namespace as n; "
        "print('|'.join(n.namespace_clashes()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "geometry") in out.stdout and "pip uninstall" in out.stdout


def test_a_failing_check_never_stops_the_import(monkeypatch):
    import probes._namespace as ns

    def broken():
        raise ValueError("malformed METADATA of some other distribution")

    monkeypatch.setattr(ns, "namespace_clashes", broken)
    assert ns.warn_on_clash() == []

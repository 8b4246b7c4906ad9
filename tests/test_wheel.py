"""The release: ``python -m build`` gives a wheel and an sdist that ``twine check`` accepts; the wheel,
installed into a fresh virtual environment, runs from a temporary folder on its own files.

The build runs on a copy of the source tree (no stale ``build/`` or ``*.egg-info`` of the checkout can
leak into it, and the checkout is left untouched) without build isolation (offline: setuptools comes
from the test environment), and the wheel is built from the sdist, so a file missing from the sdist
fails here. The new environment gets its dependencies from the test environment's site-packages (a
``.pth`` path entry; no second torch download) and losslens itself with ``pip install --no-deps``.
About 40 s on 2 cores, most of it ``losslens demo --quick``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
import zipfile
from pathlib import Path

import pytest

from tests.environment import UNDER_CI

ROOT = Path(__file__).resolve().parents[1]
if not UNDER_CI and not all(importlib.util.find_spec(m) for m in ("build", "twine")):  # CI has the dev extra
    pytest.skip(
        "the release test needs build and twine (in the dev extra: pip install -e '.[dev]')", allow_module_level=True
    )
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
_SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    "demo-out",
    "test-artifacts",
    "_build",
    "*.sqlite",
    ".ipynb_checkpoints",
)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def _source_files(installed: bool = False) -> set[str]:
    """What the sdist (``installed=False``: the checkout's paths) or the wheel (``installed=True``: the
    paths under ``losslens/``, probes/ mapped to ``losslens/`` and geometry/ to ``losslens/geometry/``)
    must hold: every module, py.typed and lm-eval task YAML of geometry/ and probes/."""
    files = set()
    for pkg, target in (("geometry", "losslens/geometry"), ("probes", "losslens")):
        for p in (ROOT / pkg).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed", ".yaml"):
                rel = p.relative_to(ROOT / pkg).as_posix()
                files.add(f"{target}/{rel}" if installed else f"{pkg}/{rel}")
    return files


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("release")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP)
    out = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)])
    return out


@pytest.mark.slow
def test_build_gives_wheel_and_sdist_that_twine_accepts(dist):
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert [w.name for w in wheels] == [f"losslens-{VERSION}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"losslens-{VERSION}.tar.gz"]
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)])
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    with zipfile.ZipFile(wheels[0]) as zf:
        names = {n for n in zf.namelist() if not n.startswith("losslens-")}
        top_level = zf.read(f"losslens-{VERSION}.dist-info/top_level.txt").decode().split()
        entry_points = zf.read(f"losslens-{VERSION}.dist-info/entry_points.txt").decode()
    assert names == _source_files(installed=True)  # nothing missing (py.typed included), nothing stale
    with tarfile.open(sdists[0]) as tf:
        in_sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "CHANGELOG.md", "geometry/py.typed", "probes/py.typed"} <= in_sdist
    assert {f for f in _source_files()} <= in_sdist
    assert top_level == ["losslens"]  # one top-level package, named after the distribution
    assert "losslens = losslens.cli.app:app" in entry_points


def _venv_with_test_packages(where: Path) -> Path:
    """A fresh venv whose packages are the test environment's (one .pth path entry per site dir)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    # plain path lines: the test environment's own .pth files (an editable losslens among them) do not run
    (purelib / "_test_env.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return py


@pytest.mark.slow
def test_wheel_runs_from_a_fresh_venv(dist, tmp_path):
    py = _venv_with_test_packages(tmp_path / "venv")
    wheel = next(dist.glob("*.whl"))
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{tmp_path / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    where = _run(
        [
            str(py),
            "-c",
            "import losslens, losslens.geometry; print(losslens.geometry.__file__); print(losslens.__file__)",
        ],
        cwd=run_dir,
        env=env,
    )
    for old in ("geometry", "probes"):  # the generic names of the first releases are not installed
        gone = subprocess.run([str(py), "-c", f"import {old}"], cwd=run_dir, env=env, capture_output=True, text=True)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, (old, gone.stderr)
    venv = (tmp_path / "venv").resolve()
    files = [Path(line).resolve() for line in where.stdout.split()]
    assert len(files) == 2 and all(venv in f.parents for f in files), (files, venv)
    assert not any(ROOT in f.parents for f in files)
    assert where.stderr == "", where.stderr

    losslens = tmp_path / "venv" / "bin" / "losslens"
    assert _run([str(losslens), "--version"], cwd=run_dir, env=env).stdout.strip() == VERSION
    demo = _run([str(losslens), "demo", "--quick", "--quiet", "--out", str(run_dir / "demo")], cwd=run_dir, env=env)
    assert (run_dir / "demo" / "report.html").stat().st_size > 0
    assert (run_dir / "demo" / "results.sqlite").is_file()
    assert "time:" in demo.stdout

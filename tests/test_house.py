"""The house rules (ARCHITECTURE.md), enforced by scripts/check_house.py: no module over 400 lines,
no import circles (function-local imports included), geometry/ free of probes, transformers, plotly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_house.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_house", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_house"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def _write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _messy_house(root: Path) -> None:
    """A tiny repository breaking every rule once, plus clean modules that must not be reported. Its
    folders are imported as the distribution maps them: probes/ is ``losslens``, geometry/ is
    ``losslens.geometry``."""
    _write(root, "geometry/__init__.py")
    _write(
        root, "geometry/draw.py", "import math\n\n\ndef draw():\n    import plotly.graph_objects as go\n    return go\n"
    )
    _write(root, "geometry/upward.py", "from losslens.lm import clean\n")
    _write(root, "geometry/ok.py", "import numpy as np\nfrom .draw import draw\nfrom losslens.geometry import ok\n")
    _write(root, "probes/__init__.py")
    # a circle hidden behind a function-local import
    _write(root, "probes/x.py", "def f():\n    from . import y\n    return y\n")
    _write(root, "probes/y.py", "import losslens.x\n")
    # a circle through a package __init__: importing losslens.data.tokens runs probes/data/__init__.py
    _write(root, "probes/data/__init__.py", "from .sets import build\n")
    _write(root, "probes/data/sets.py", "from losslens.models.loader import load\n\n\ndef build():\n    return load\n")
    _write(root, "probes/data/tokens.py", "TOKENS = 1\n")
    _write(root, "probes/models/__init__.py")
    _write(
        root,
        "probes/models/loader.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from losslens.data.tokens import TOKENS\n\n\ndef load():\n    return 1\n",
    )
    _write(root, "probes/long.py", "x = 1\n" * 401)
    _write(root, "probes/clean.py", "import os\nfrom losslens.data import tokens\n" + "y = 2\n" * 398)
    _write(root, "benchmarks/__init__.py")
    _write(root, "benchmarks/b.py", "from losslens.x import f\n")


def test_the_checker_finds_every_broken_rule(tmp_path):
    ch = _checker()
    _messy_house(tmp_path)
    problems = ch.check(tmp_path)
    circles = [p for p in problems if p.startswith("import circle")]
    assert len(circles) == 2, problems
    assert any("losslens.x, losslens.y:" in p for p in circles)
    assert any("losslens.data, losslens.data.sets, losslens.models.loader:" in p for p in circles)
    assert [p for p in problems if p.startswith("too long")] == ["too long: probes/long.py has 401 lines (limit 400)"]
    forbidden = sorted(p for p in problems if p.startswith("forbidden import"))
    assert len(forbidden) == 2, problems
    assert (
        "geometry/draw.py:5 imports plotly" in forbidden[0]
        and "geometry/upward.py:1 imports losslens.lm" in forbidden[1]
    )
    assert len(problems) == 5  # nothing about clean.py (400 lines, no circle), ok.py or benchmarks/b.py


def test_the_checker_fails_from_the_command_line(tmp_path):
    _messy_house(tmp_path)
    bad = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "5 problem(s)" in bad.stdout
    good = subprocess.run([sys.executable, str(SCRIPT), str(ROOT)], capture_output=True, text=True)
    assert good.returncode == 0 and "all rules hold" in good.stdout


def _roomed_house(root: Path) -> None:
    """geometry/ in rooms, breaking rule 4 twice (an upward import, a module outside the rooms)."""
    _write(root, "geometry/__init__.py", "from .estimators.trace import t\n")
    _write(root, "geometry/base/__init__.py")
    _write(root, "geometry/base/results.py", "R = 1\n")
    _write(root, "geometry/memory/__init__.py")
    _write(root, "geometry/memory/model.py", "from ..base.results import R\n")
    _write(root, "geometry/operators/__init__.py")
    _write(root, "geometry/operators/hessian.py", "from ..memory.model import R\n")
    _write(root, "geometry/estimators/__init__.py")
    _write(root, "geometry/estimators/trace.py", "from ..operators.hessian import R\n\n\ndef t():\n    return R\n")
    _write(root, "geometry/surfaces/__init__.py")
    _write(
        root, "geometry/surfaces/planes.py", "from losslens.geometry.estimators.trace import t\n"
    )  # surfaces may not
    _write(root, "geometry/stray.py", "X = 1\n")


def test_the_checker_enforces_geometrys_room_order(tmp_path):
    ch = _checker()
    _roomed_house(tmp_path)
    problems = ch.check(tmp_path)
    assert problems == [
        "outside the rooms: geometry/stray.py (put it in one of geometry/base/, geometry/memory/, "
        "geometry/operators/, geometry/estimators/, geometry/surfaces/)",
        "room order: geometry/surfaces/planes.py:1 imports losslens.geometry.estimators (geometry/surfaces/ may import "
        "base, memory)",
    ], problems


def _roomed_probes(root: Path) -> None:
    """probes/ in its four rooms, breaking the room order three ways."""
    _write(root, "probes/__init__.py", "def __getattr__(name):\n    return name\n")
    _write(root, "probes/__main__.py", "from losslens.cli.app import app\n")  # the front door: allowed
    _write(root, "probes/lm/__init__.py")
    _write(root, "probes/lm/core.py", "from losslens.study.other import run\n")  # lm may import no room
    _write(root, "probes/study/other.py", "run = 1\n")
    _write(root, "probes/measure/__init__.py")
    _write(root, "probes/measure/trace.py", "from losslens.lm.core import x\nfrom losslens import sharpness\n")
    _write(root, "probes/study/__init__.py")
    _write(root, "probes/study/sweep.py", "from losslens.measure.trace import t\nfrom losslens.geometry import g\n")
    _write(root, "probes/cli/__init__.py")
    _write(root, "probes/cli/app.py", "from losslens.study.sweep import run\n")
    _write(root, "probes/stray.py", "X = 1\n")


def test_the_checker_enforces_the_probes_room_order(tmp_path):
    _roomed_probes(tmp_path)
    problems = _checker().check(tmp_path)
    assert problems == [
        "outside the rooms: probes/stray.py (put it in one of probes/lm/, probes/measure/, probes/study/, probes/cli/)",
        "room order: probes/lm/core.py:1 imports losslens.study (probes/lm/ may import no other room)",
        "room order: probes/measure/trace.py:2 imports the front door losslens (import the room that defines the name)",
    ], problems


def test_pyproject_lists_every_package_folder_under_its_import_name():
    """The distribution maps probes/ to ``losslens`` and geometry/ to ``losslens.geometry``; every folder
    with an ``__init__.py`` is a listed package, and nothing else is."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'^    "(losslens[\w.]*)",$', text, flags=re.M))
    folders = {"probes": "losslens", "geometry": "losslens.geometry"}
    found = set()
    for folder, name in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert listed == found, (sorted(listed - found), sorted(found - listed))
    assert 'package-dir = {"losslens" = "probes", "losslens.geometry" = "geometry"}' in text


def test_no_two_modules_of_probes_share_a_file_name():
    names: dict[str, list[str]] = {}
    for path in (ROOT / "probes").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py", "utils.py") or path.parent == ROOT / "probes":
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {k: v for k, v in names.items() if len(v) > 1}
    assert shared == {}, shared
    loose = sorted(p.name for p in (ROOT / "probes").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose  # the front door only


def test_the_old_top_level_names_are_gone():
    """Only ``losslens`` is imported: ``import geometry`` / ``import probes`` (the two generic names the
    first releases installed) appear nowhere in the code, the notebooks or the docs."""
    import re

    pattern = re.compile(r"(?<![\w.])(?:import|from) (?:geometry|probes)\b|-m (?:geometry|probes)\b")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for rel in files:
        path = ROOT / rel
        if rel == "CHANGELOG.md" or path.suffix not in {".py", ".md", ".rst", ".ipynb", ".toml", ".sh"}:
            continue
        if not path.is_file() or rel in (
            "tests/test_house.py",
            "scripts/check_docs_stale.py",
            "tests/test_docs_stale.py",
        ):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{rel}:{i}: {line.strip()[:120]}")
    assert hits == [], "old top-level names:\n" + "\n".join(hits)


# the flat layout before the rooms: none of these module paths may exist or be named again
OLD_GEOMETRY_MODULES = (
    "results",
    "_linalg",
    "params",
    "batches",
    "modes",
    "jsonable",
    "graph_memory",
    "operator",
    "hessian",
    "_forward",
    "dense",
    "derivatives",
    "attention",
    "linear_ce",
    "trace",
    "eigen",
    "_lanczos",
    "density",
    "directional",
    "attribution",
    "_checks",
    "planes",
    "grid",
    "surface",
    "moving",
)


def test_no_old_geometry_module_path_is_importable_or_named():
    import importlib
    import re

    for old in OLD_GEOMETRY_MODULES:
        assert importlib.util.find_spec(f"losslens.geometry.{old}") is None, f"losslens.geometry.{old} still importable"
    # losslens.geometry.memory is now a room: its __init__ holds none of the old module's names
    memory_room = importlib.import_module("losslens.geometry.memory")
    for name in ("MemoryEstimate", "available_bytes", "resolve_budget", "default_budget"):
        assert not hasattr(memory_room, name), (
            f"losslens.geometry.memory re-exports {name}: import losslens.geometry.memory.model"
        )
    old = "|".join(OLD_GEOMETRY_MODULES)
    pattern = re.compile(
        rf"(?<![\w.])geometry[./](?:(?:{old})(?![\w/])|"
        rf"memory\.(?!model\b|graphs\b|allocator\b|sizes\b)\w+|memory import)"
    )
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for rel in files:
        path = ROOT / rel
        if path.suffix not in {".py", ".md", ".ipynb", ".toml", ".txt"} or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and "OLD_GEOMETRY_MODULES" not in line:
                hits.append(f"{rel}:{i}: {line.strip()[:120]}")
    assert hits == [], "old geometry module paths:\n" + "\n".join(hits)

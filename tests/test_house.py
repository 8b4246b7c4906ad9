"""The house rules (ARCHITECTURE.md), enforced by scripts/check_house.py: no module over 500 lines,
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
    """A tiny repository breaking every rule once, plus clean modules that must not be reported."""
    _write(root, "geometry/__init__.py")
    _write(root, "geometry/draw.py", "import math\n\n\ndef draw():\n    import plotly.graph_objects as go\n    return go\n")
    _write(root, "geometry/upward.py", "from probes import clean\n")
    _write(root, "geometry/ok.py", "import numpy as np\nfrom .draw import draw\n")
    _write(root, "probes/__init__.py")
    # a circle hidden behind a function-local import
    _write(root, "probes/x.py", "def f():\n    from . import y\n    return y\n")
    _write(root, "probes/y.py", "import probes.x\n")
    # a circle through a package __init__: importing probes.data.tokens runs probes/data/__init__.py
    _write(root, "probes/data/__init__.py", "from .sets import build\n")
    _write(root, "probes/data/sets.py", "from probes.models.loader import load\n\n\ndef build():\n    return load\n")
    _write(root, "probes/data/tokens.py", "TOKENS = 1\n")
    _write(root, "probes/models/__init__.py")
    _write(root, "probes/models/loader.py", "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                            "    from probes.data.tokens import TOKENS\n\n\ndef load():\n    return 1\n")
    _write(root, "probes/long.py", "x = 1\n" * 501)
    _write(root, "probes/clean.py", "import os\nfrom probes.data import tokens\n" + "y = 2\n" * 498)
    _write(root, "benchmarks/__init__.py")
    _write(root, "benchmarks/b.py", "from probes.x import f\n")


def test_the_repository_follows_the_house_rules():
    problems = _checker().check(ROOT)
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_every_broken_rule(tmp_path):
    ch = _checker()
    _messy_house(tmp_path)
    problems = ch.check(tmp_path)
    circles = [p for p in problems if p.startswith("import circle")]
    assert len(circles) == 2, problems
    assert any("probes.x, probes.y:" in p for p in circles)
    assert any("probes.data, probes.data.sets, probes.models.loader:" in p for p in circles)
    assert [p for p in problems if p.startswith("too long")] == ["too long: probes/long.py has 501 lines (limit 500)"]
    forbidden = sorted(p for p in problems if p.startswith("forbidden import"))
    assert len(forbidden) == 2, problems
    assert "geometry/draw.py:5 imports plotly" in forbidden[0] and "geometry/upward.py:1 imports probes" in forbidden[1]
    assert len(problems) == 5  # nothing about clean.py (500 lines, no circle), ok.py or benchmarks/b.py


def test_the_checker_fails_from_the_command_line(tmp_path):
    _messy_house(tmp_path)
    bad = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "5 problem(s)" in bad.stdout
    good = subprocess.run([sys.executable, str(SCRIPT), str(ROOT)], capture_output=True, text=True)
    assert good.returncode == 0 and "all rules hold" in good.stdout

"""scripts/check_docs_stale.py: the docs name only modules, files and imports that exist, and retired
sentences stay retired (issue #45)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_docs_stale.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_docs_stale", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_docs_stale"] = mod
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path, doc: str) -> Path:
    """A miniature checkout: losslens (probes/) with one room, losslens.geometry (geometry/), one doc page."""
    (root / "probes" / "lm" / "quant").mkdir(parents=True)
    (root / "probes" / "__init__.py").write_text(
        '__all__ = ["quantize"]\n\n\ndef __getattr__(name):\n    if name == "quantize":\n        return 1\n'
    )
    (root / "probes" / "lm" / "__init__.py").write_text("")
    (root / "probes" / "lm" / "quant" / "__init__.py").write_text("from .dispatch import quantize\n")
    (root / "probes" / "lm" / "quant" / "dispatch.py").write_text("def quantize(model, spec):\n    pass\n")
    (root / "geometry" / "base").mkdir(parents=True)
    (root / "geometry" / "__init__.py").write_text("from .base.errors import LosslensError\n")
    (root / "geometry" / "base" / "__init__.py").write_text("")
    (root / "geometry" / "base" / "errors.py").write_text("class LosslensError(Exception):\n    pass\n")
    (root / "docs" / "howto").mkdir(parents=True)
    (root / "docs" / "howto" / "page.rst").write_text(doc)
    (root / "README.md").write_text("`losslens.lm.quant.quantize` and `geometry/base/errors.py`.\n")
    return root


def test_the_repository_passes():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problem(s)" in r.stdout


def test_existing_names_and_paths_pass(tmp_path):
    chk = _checker()
    root = _tree(
        tmp_path,
        "T\n=\n\n:func:`losslens.lm.quant.dispatch.quantize`, :class:`~losslens.geometry.LosslensError`,\n"
        "``losslens.quantize`` (the front door's lazy name), ``losslens.geometry.LosslensError.args``,\n"
        "``probes/lm/quant/`` and ``probes/lm/quant/*.py``, ``geometry/base/errors`` (a module path).\n"
        "``import geometry`` fails: the only name is losslens.\n",
    )
    assert chk.check(root) == []


def test_stale_names_paths_imports_and_retired_text_fail_and_are_named(tmp_path):
    chk = _checker()
    root = _tree(
        tmp_path,
        "T\n=\n\n"
        "1. :func:`losslens.lm.quant.api.quantize`\n"  # line 4: a renamed module
        "2. ``losslens.lm.train.run``\n"  # line 5: a room that does not exist
        "3. see ``probes/quant/api.py``\n"  # line 6: an old path
        "4. ``from geometry import HessianOperator``\n"  # line 7: an old import
        "5. :mod:`probes.sweep` and ``geometry.HessianOperator``\n"  # line 8: old package names
        "6. Products run in the model's dtype; NamespaceClashWarning\n",  # line 9: retired text
    )
    problems = chk.check(root)
    text = "\n".join(problems)
    assert "docs/howto/page.rst:4: losslens.lm.quant.api.quantize" in text and "'api'" in text
    assert "docs/howto/page.rst:5: losslens.lm.train.run" in text
    assert "docs/howto/page.rst:6: probes/quant/api.py: no such file or folder" in text
    assert "docs/howto/page.rst:7: 'from geometry'" in text
    assert "docs/howto/page.rst:8: :mod:`probes.sweep`" in text and "geometry.HessianOperator: there is no" in text
    assert sum("docs/howto/page.rst:9: retired text" in p for p in problems) == 2
    assert len(problems) == 8, text

    r = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)
    assert r.returncode == 1 and "8 problem(s)" in r.stdout and "probes/quant/api.py" in r.stdout, r.stdout

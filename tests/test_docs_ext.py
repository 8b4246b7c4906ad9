"""The docs' reference extension (docs/_ext/rooms.py): a docstring's short names resolve as Python would,
prose in numpy type fields stays prose, and a reference to something that does not exist still fails
the strict build (the resolver must not hide broken references)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
rooms = pytest.importorskip("rooms")  # needs sphinx (dev extra)
import autodoc_fixes  # noqa: E402 - docs/_ext is on the path from here
import references  # noqa: E402


def test_type_like():
    for t in ("int", "dict[str, Tensor]", "str or None", "bool, optional", "int | None", ":class:`Plane`", "float."):
        assert autodoc_fixes._type_like(t), t
    for t in ("dict name -> Tensor (the origin's shapes)", "a natural half-width of the plot", "label -> (x, y)"):
        assert not autodoc_fixes._type_like(t), t


def test_prose_type_fields_go_back_to_the_description():
    lines = [
        ":param model: names are written consistently).",
        ":type model: the model whose tensors move (tied",
        ":param k: number of vectors",
        ":type k: int",
    ]
    autodoc_fixes._prose_types(None, "function", "f", None, {}, lines)
    assert lines == [
        ":param model: the model whose tensors move (tied names are written consistently).",
        ":param k: number of vectors",
        ":type k: int",
    ]
    attr = [".. attribute:: coords", "", "   ", "", "   :type: label -> (x, y) of the marked points."]
    autodoc_fixes._prose_types(None, "class", "C", None, {}, attr)
    assert "   label -> (x, y) of the marked points." in attr and not any(":type:" in a for a in attr)


def test_short_names_are_qualified_in_the_docstrings_module():
    from losslens.geometry.estimators import density

    lines = ["memory: :func:`estimate_memory`; :class:`~CurvatureOperator`; :func:`!literal`; :mod:`.x`"]
    references._record(None, "function", "losslens.geometry.spectral_density", density.spectral_density, {}, lines)
    assert ":func:`estimate_memory <losslens.geometry.estimators.density.estimate_memory>`" in lines[0]
    assert ":class:`CurvatureOperator <losslens.geometry.operators.interface.CurvatureOperator>`" in lines[0]
    assert ":func:`!literal`" in lines[0] and ":mod:`.x`" in lines[0]


def _build(tmp: Path, body: str) -> subprocess.CompletedProcess:
    src = tmp / "src"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'docs' / '_ext')!r}]\n"
        "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'rooms']\n"
        "nitpicky = True\nautodoc_inherit_docstrings = False\n"
        "nitpick_ignore_regex = [(r'py:.*', r'(torch|dict|str|float|tuple|int|Any|Tensor|np|numpy|Sequence)(\\..*)?'),"
        " (r'py:(class|obj|data)', r'.*[^\\w.].*')]\n"
    )
    (src / "index.rst").write_text(
        "T\n=\n\n.. autoclass:: losslens.geometry.Plane\n   :no-members:\n\n"
        ".. autoclass:: losslens.geometry.Line\n   :no-members:\n\n" + body + "\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-n", "-q", "-b", "html", str(src), str(tmp / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_existing_references_resolve_and_broken_ones_fail(tmp_path):
    """One nitpicky build, three references: two that exist resolve (no warning), the missing member warns."""
    out = _build(
        tmp_path,
        ":attr:`losslens.geometry.Plane.coords` (a field without a docstring), "
        ":class:`losslens.geometry.surfaces.planes.Plane` (where it is defined), "
        ":attr:`losslens.geometry.Plane.no_such_member`.",
    )
    warnings = [ln for ln in out.stderr.splitlines() if "WARNING" in ln or "ERROR" in ln]
    assert len(warnings) == 1 and "no_such_member" in warnings[0], out.stderr[-3000:]


def test_typer_signatures_show_the_python_types():
    sig = (
        "(checkpoint: ~typing.Annotated[str, <typer.models.ArgumentInfo object at 0x7f79>], *, "
        "tasks: ~typing.Annotated[~typing.List[str], <typer.models.OptionInfo object at 0x7f7a>] = ['x'], k: int = 1)"
    )
    out, ret = autodoc_fixes._plain_typer_signature(None, "function", "f", None, {}, sig, "None")
    assert out == "(checkpoint: str, *, tasks: ~typing.List[str] = ['x'], k: int = 1)" and ret == "None"
    assert autodoc_fixes._plain_typer_signature(None, "function", "f", None, {}, "(k: int = 1)", None) is None


def test_a_submodule_skips_only_the_exported_name_itself():
    """Small ints share one object: MIN_NU = 10 is not skipped because another room exports a 10."""
    ten = 10
    references._EXPORTED[id(ten)] = "losslens.x.SOME_TEN"
    try:
        assert rooms._skip_exported(None, "module", "SOME_TEN", ten, False, {}) is True
        assert rooms._skip_exported(None, "module", "MIN_NU", ten, False, {}) is None
    finally:
        del references._EXPORTED[id(ten)]

"""The docs site (docs/, ``make docs``): the strict build passes offline, and the reference holds every
public name.

The build is the one ``make docs`` runs: ``sphinx -E -W -n`` (every warning fails, every reference must
resolve), in a subprocess whose proxy variables point at a closed port, so a build that tried to fetch
anything (an intersphinx inventory, a remote image) would fail. About 20-30 s on 2 cores.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment import UNDER_CI

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

if importlib.util.find_spec("myst_parser") is None and not UNDER_CI:  # CI installs the dev extra: there it must run
    pytest.skip("the docs need myst-parser (in the dev extra: pip install -e '.[dev]')", allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    env = dict(os.environ)
    closed = "http://127.0.0.1:9"  # nothing listens there: any download fails the build
    env.update(http_proxy=closed, https_proxy=closed, HTTP_PROXY=closed, HTTPS_PROXY=closed, no_proxy="", NO_PROXY="")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"strict docs build failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return out


def _inventory(site: Path) -> set[str]:
    """Every object name in the site's objects.inv (what other projects would link to)."""
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as f:
        inv = InventoryFile.load(f, "", os.path.join)  # {"py:function": {name: item}, ...}
    return {name for entries in inv.values() for name in entries}


def _rooms_with_all() -> dict[str, list[str]]:
    """geometry and every room of probes whose package defines ``__all__`` -> its names."""
    import losslens.geometry
    import losslens

    rooms = {"geometry": list(losslens.geometry.__all__)}
    for info in pkgutil.iter_modules(losslens.__path__):
        if info.ispkg:
            mod = importlib.import_module(f"losslens.{info.name}")
            if hasattr(mod, "__all__"):
                rooms[mod.__name__] = list(mod.__all__)
    return rooms


def test_strict_offline_build(site):
    for page in ("index", "getting-started", "science", "howto/index", "reference/index", "reference/geometry"):
        assert (site / f"{page}.html").is_file(), page
    assert "sphinx.ext.intersphinx" not in (DOCS / "conf.py").read_text()


def test_every_public_name_is_in_the_reference(site):
    inventory = _inventory(site)
    rooms = _rooms_with_all()
    assert {"geometry", "losslens.lm.quant", "losslens.study.sweep", "losslens.lm.core"} <= set(rooms)
    missing = [f"{room}.{name}" for room, names in rooms.items() for name in names if f"{room}.{name}" not in inventory]
    assert not missing, f"public names missing from the API reference: {missing}"


def test_geometry_names_are_grouped_by_room(site):
    """Each name of losslens.geometry.__all__ is documented on the page of the room that defines it."""
    import losslens.geometry

    for name in losslens.geometry.__all__:
        room = ".".join(getattr(losslens.geometry, name).__module__.split(".")[:3])
        page = (site / "reference" / f"{room}.html").read_text()
        assert f'id="geometry.{name}"' in page, (name, room)


def test_included_sources_are_rendered(site):
    """science.md and the README's ten-line example are included, not copied: their text is on the pages."""
    science = (site / "science.html").read_text()
    for heading in re.findall(r"^## (.+)$", (ROOT / "docs" / "science.md").read_text(), flags=re.M):
        assert heading.split("(")[0].strip().split()[-1] in science, heading
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API in ten lines", 1)[1].split("## The command line", 1)[0]
    first_code = re.search(r"```python\n(.+?)\n", section).group(1)
    html = re.sub(r"<[^>]+>", "", (site / "getting-started.html").read_text()).replace("&quot;", '"')
    assert first_code.split()[-1] in html and "Trajectory.from_folder" in html
    bench = (site / "howto" / "benchmarks.html").read_text()
    assert "HVP throughput" in bench

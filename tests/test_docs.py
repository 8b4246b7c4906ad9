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


def _rooms() -> tuple[list[str], list[str]]:
    """(rooms, modules), from the code. Rooms have a reference page each: the front door, losslens.geometry
    and its rooms, the group packages (losslens.lm, .measure, .study) and each of their packages, and
    losslens.cli. Modules are the public one-module members of a group (losslens.measure.sharpness):
    documented on the group's page, or on a page of their own where docs/reference has one."""
    import losslens
    import losslens.geometry

    rooms = ["losslens", "losslens.geometry"]
    rooms += [f"losslens.geometry.{i.name}" for i in pkgutil.iter_modules(losslens.geometry.__path__) if i.ispkg]
    modules = []
    for group in pkgutil.iter_modules(losslens.__path__):
        if not group.ispkg or group.name.startswith("_"):
            continue
        rooms.append(f"losslens.{group.name}")
        if group.name == "cli":  # one page: the commands are modules of the room
            continue
        pkg = importlib.import_module(f"losslens.{group.name}")
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                (rooms if info.ispkg else modules).append(f"{pkg.__name__}.{info.name}")
    return rooms, modules


def _rooms_with_all() -> dict[str, list[str]]:
    """The front door, losslens.geometry and every room or group module that defines ``__all__`` -> its
    names (a geometry room's names are losslens.geometry's)."""
    rooms, modules = _rooms()
    found = {}
    for room in rooms + modules:
        mod = importlib.import_module(room)
        if hasattr(mod, "__all__") and not room.startswith("losslens.geometry."):
            found[room] = list(mod.__all__)
    return found


def test_strict_offline_build(site):
    for page in ("index", "getting-started", "science", "howto/index", "reference/index"):
        assert (site / f"{page}.html").is_file(), page
    assert "sphinx.ext.intersphinx" not in (DOCS / "conf.py").read_text()


def test_every_room_has_its_page(site):
    """One page per room, named by its import name; a new room without a page fails here."""
    rooms, modules = _rooms()
    assert {"losslens", "losslens.geometry.operators", "losslens.lm", "losslens.lm.quant", "losslens.cli"} <= set(rooms)
    assert {"losslens.measure.probes", "losslens.study.sweep"} <= set(rooms)
    assert "losslens.measure.sharpness" in modules
    missing = [room for room in rooms if not (site / "reference" / f"{room}.html").is_file()]
    assert not missing, f"rooms without a reference page (add docs/reference/ROOM.rst with .. room:: ROOM): {missing}"
    pages = {p.stem for p in (DOCS / "reference").glob("*.rst")} - {"index"}
    assert pages <= set(rooms) | set(modules), f"pages of nothing: {sorted(pages - set(rooms) - set(modules))}"


def test_every_public_name_is_in_the_reference(site):
    """Every name of every ``__all__`` (the front door's included, whatever it holds when built)."""
    inventory = _inventory(site)
    rooms = _rooms_with_all()
    assert {"losslens", "losslens.geometry", "losslens.lm.quant", "losslens.study.sweep", "losslens.lm.core"} <= set(
        rooms
    )
    missing = [f"{room}.{name}" for room, names in rooms.items() for name in names if f"{room}.{name}" not in inventory]
    assert not missing, f"public names missing from the API reference: {missing}"


def test_the_front_door_points_at_the_rooms(site):
    """Each name of ``losslens.__all__`` is on the front door's page, as the same object as its room's entry."""
    import losslens

    page = (site / "reference" / "losslens.html").read_text()
    for name in losslens.__all__:
        assert f'id="losslens.{name}"' in page, name


def test_geometry_names_are_grouped_by_room(site):
    """Each name of losslens.geometry.__all__ is documented on the page of the room that defines it."""
    import losslens.geometry

    for name in losslens.geometry.__all__:
        room = ".".join(getattr(losslens.geometry, name).__module__.split(".")[:3])
        page = (site / "reference" / f"{room}.html").read_text()
        assert f'id="losslens.geometry.{name}"' in page, (name, room)


def test_included_sources_are_rendered(site):
    """science.md and the README's Python section are included, not copied: their text is on the pages."""
    science = (site / "science.html").read_text()
    for heading in re.findall(r"^## (.+)$", (ROOT / "docs" / "science.md").read_text(), flags=re.M):
        assert heading.split("(")[0].strip().split()[-1] in science, heading
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("## The command line", 1)[0]
    first_code = re.search(r"```python\n(.+?)\n", section).group(1)
    html = re.sub(r"<[^>]+>", "", (site / "getting-started.html").read_text()).replace("&quot;", '"')
    assert first_code.split()[-1] in html and "losslens.open_trajectory" in html
    bench = (site / "howto" / "benchmarks.html").read_text()
    assert "HVP throughput" in bench

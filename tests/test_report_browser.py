"""End to end: build a report, open it in headless Chromium, check every figure rendered.

Needs the system Chromium and its WebDriver (Debian ``chromium`` + ``chromium-driver``; run
``scripts/install-browser.sh``) and selenium (dev extras). Outside CI the tests skip with a reason
when the browser or selenium is absent; under CI (``CI=true``, where ``make test`` installs them)
they fail instead. A browser that is present but cannot start fails everywhere. The screenshot is
saved as ``test-artifacts/report.png`` (and ``test-artifacts/surface.png``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from tests.environment import CHROMEDRIVER, CHROMIUM, UNDER_CI

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"


def _tiny_surface():
    from losslens.geometry.surfaces.surface import Surface

    x = np.linspace(-0.5, 1.5, 9)
    y = np.linspace(-0.5, 1.5, 8)
    X, Y = np.meshgrid(x, y)
    loss = 3 + (X - 0.2) ** 2 + 2 * (Y - 0.1) ** 2
    loss[3, 4] = np.nan  # a hole
    pts = {"A": (0.0, 0.0, 3.1), "B": (1.0, 0.0, 3.7), "C": (0.1, 0.9, 4.6)}
    plane = {
        "kind": "points",
        "coords": {k: [v[0], v[1]] for k, v in pts.items()},
        "norms": {"|B-A|": 1.0, "|C-A|": 0.9},
    }
    return Surface(x, y, loss, pts, plane, n_nonfinite=1)


def browser_missing() -> str | None:
    """Why the browser test cannot run here (None when Chromium, its driver and selenium are present)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        return (
            "headless Chromium not found (need /usr/bin/chromium and /usr/bin/chromedriver; "
            "run scripts/install-browser.sh)"
        )
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def require_browser() -> None:
    """Skip (outside CI) or fail (under CI) when the browser test cannot run here."""
    missing = browser_missing()
    if missing:
        if UNDER_CI:
            pytest.fail(f"CI=true but {missing}: `make test` installs them, so the browser tests must run under CI")
        pytest.skip(missing)


@contextlib.contextmanager
def chromium_driver(binary: str | None = None):
    """A headless Chromium WebDriver session. A browser that is installed but cannot start raises
    (a failure, not a skip): a broken browser must not pass for an absent one."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="losslens-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary or CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1300,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        try:
            yield drv
        finally:
            drv.quit()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def driver():
    with chromium_driver() as drv:
        yield drv


def test_missing_browser_skips_outside_ci_and_fails_under_ci(monkeypatch):
    """Issue #12: the browser tests used to skip on any problem, also under CI where `make test`
    installs Chromium. Simulate an absent browser both ways."""
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "CHROMIUM", None)
    monkeypatch.setattr(module, "UNDER_CI", False)
    with pytest.raises(pytest.skip.Exception, match="Chromium not found"):
        require_browser()
    monkeypatch.setattr(module, "UNDER_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_browser()


def test_a_browser_that_cannot_start_fails():
    """A Chromium that is present but does not start (here: a binary that exits at once) raises;
    before issue #12 it was turned into a skip."""
    require_browser()
    from selenium.common.exceptions import WebDriverException

    with pytest.raises(WebDriverException):
        with chromium_driver(binary=shutil.which("false") or "/bin/false"):
            pass


def _check_page(driver, path: Path, screenshot: Path, timeout: float = 45.0) -> int:
    driver.get(path.resolve().as_uri())
    n_figs = driver.execute_script("return document.querySelectorAll('.plotly-graph-div').length")
    assert n_figs > 0, "the page holds no Plotly figure"
    deadline = time.time() + timeout
    script = """
        const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
        return divs.map(d => !!d.querySelector('.main-svg') && (d._fullLayout !== undefined)
                        && (d.querySelector('.plot') !== null || d.querySelector('.gl-container') !== null));
    """
    rendered = []
    while time.time() < deadline:
        rendered = driver.execute_script(script)
        if rendered and all(rendered):
            break
        time.sleep(0.5)
    missing = [i for i, ok in enumerate(rendered) if not ok]
    assert not missing, f"figures {missing} of {len(rendered)} did not render"
    # every trace drawn: Plotly keeps its full data; 3D scenes are WebGL, 2D traces are SVG groups
    n_traces = driver.execute_script(
        "return Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => d._fullData.length)"
    )
    assert all(n > 0 for n in n_traces), f"a figure has no traces: {n_traces}"
    logs = driver.get_log("browser")
    severe = [entry for entry in logs if entry.get("level") == "SEVERE"]
    assert not severe, f"JavaScript errors in the console: {severe}"
    ARTIFACTS.mkdir(exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1300, min(int(height) + 100, 9000))
    time.sleep(0.5)
    driver.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    return n_figs


def test_report_renders_in_chromium(driver, tmp_path):
    from losslens.study import analysis
    from losslens.study.report.figures import synthetic_results
    from losslens.study.report.pages import build_report

    from losslens.study.report.explain_figures import synthetic_explain

    df = synthetic_explain(synthetic_results(n_checkpoints=8, runs=("wsd", "cosine")))
    wsd = df[df["run"] == "wsd"]
    phases = analysis.detect_phases(wsd, gap="rtn:4:g128")
    corr = analysis.summary(wsd, n_boot=200)
    out = build_report(
        df,
        tmp_path / "report.html",
        correlations=corr,
        phases={"wsd": phases},
        surfaces={"wsd-step800: A=Θ_K, B=Θ_K−1, C=rtn:4:g128": _tiny_surface()},
        plan={"probes": ["loss", "quant", "trace"], "quick": True},
        title="losslens test report",
    )
    text = out.read_text()
    import re

    assert not re.search(r"<script[^>]+src=", text), "the report must not load scripts from elsewhere"
    assert not re.search(r"<link[^>]+href=", text), "the report must not load stylesheets from elsewhere"
    assert text.count("plotly.js") >= 1
    n = _check_page(driver, out, ARTIFACTS / "report.png")
    assert n >= 9  # loss, quant, sharpness, 2 scatters, 3 explain figures, 1 surface


def test_surface_page_renders_in_chromium(driver, tmp_path):
    from losslens.study.report.pages import surface_page

    out = surface_page(_tiny_surface(), tmp_path / "surface.html", title="tiny surface")
    assert _check_page(driver, out, ARTIFACTS / "surface.png") == 3


# --------------------------------------------------------------------------- issue 49: the report's layout
def _tiny_landscape():
    """A landscape of two runs ("wsd", "cosine") in a 3-D toy parameter space, with quantized points
    far off the plane (so the figure carries its subtitle), built without a model."""
    import torch

    from losslens.geometry.surfaces.surface import Surface
    from losslens.geometry.surfaces.trajectory_axes import ProjectedPoint
    from losslens.geometry.surfaces.trajectory_pca import trajectory_pca
    from losslens.study.landscape.trajectory_landscape import Landscape, RunPath

    rng = np.random.default_rng(0)
    runs = {"wsd": [], "cosine": []}
    points, labels = [], []
    for r_i, run in enumerate(runs):
        for k in range(4):
            labels.append(f"{run}/step-{100 * (k + 1)}")
            runs[run].append(labels[-1])
            points.append({"w": torch.tensor([k * 1.0, (-1) ** r_i * k * 0.6, rng.normal(0, 0.2)])})
    pca = trajectory_pca(points, labels=labels)
    xy = pca.plane_coords()
    x, y = (
        np.linspace(xy[:, 0].min() - 1, xy[:, 0].max() + 1, 9),
        np.linspace(xy[:, 1].min() - 1, xy[:, 1].max() + 1, 8),
    )
    X, Y = np.meshgrid(x, y)
    marked = {lab: (float(xy[i, 0]), float(xy[i, 1]), 3 + 0.1 * xy[i, 0] ** 2) for i, lab in enumerate(labels)}
    quantized = {
        lab: ProjectedPoint(f"{lab}+rtn", np.array([xy[i, 0] + 0.3, xy[i, 1] + 0.2]), 2.0, 1.5)
        for i, lab in enumerate(labels)
    }
    surface = Surface(x, y, 3 + 0.1 * X**2 + 0.05 * Y**2, marked, {"kind": "pca"})
    paths = [
        RunPath(run, labs, [100 * (k + 1) for k in range(4)], [1e-3] * 4, [False] * 4) for run, labs in runs.items()
    ]
    return Landscape(pca, paths, quantized, {lab: v[2] for lab, v in marked.items()}, surface, "rtn:2:g32")


def _wait_rendered(driver, timeout: float = 45.0) -> None:
    script = (
        "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
        ".every(d => d._fullLayout !== undefined && !!d.querySelector('.main-svg'))"
    )
    deadline = time.time() + timeout
    while time.time() < deadline and not driver.execute_script(script):
        time.sleep(0.5)
    assert driver.execute_script(script), "the figures did not render"


# the rendered boxes of a figure's titles, axis titles, annotations (subplot titles), colour-bar titles
# and legend, and every pair of them (and legend × x tick label) that intersects by more than 4 px²
_OVERLAPS_JS = """
const div = arguments[0], items = [], ticks = [], hits = [];
const box = el => { const r = el.getBoundingClientRect(); return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; };
const add = (kind, sel, into) => div.querySelectorAll(sel).forEach(el => {
  const b = box(el), text = (el.textContent || '').trim().slice(0, 60);
  if (b.x1 - b.x0 > 0.5 && b.y1 - b.y0 > 0.5 && (text || kind === 'legend')) into.push({kind, text, ...b}); });
add('title', 'text.gtitle', items);
add('axis title', 'text[class*="xtitle"], text[class*="ytitle"]', items);
add('annotation', '.annotation-text-g', items);
add('colour-bar title', '.cbtitle text', items);
add('legend', '.legend .bg', items);
add('x tick', '[class*="xtick"] text', ticks);
const area = (a, b) => Math.max(0, Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0))
                     * Math.max(0, Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0));
for (let i = 0; i < items.length; i++) for (let j = i + 1; j < items.length; j++)
  if (area(items[i], items[j]) > 4)
    hits.push(`${items[i].kind} "${items[i].text}" × ${items[j].kind} "${items[j].text}"`);
items.filter(a => a.kind === 'legend').forEach(l => ticks.forEach(t => {
  if (area(l, t) > 4) hits.push(`legend × x tick "${t.text}"`); }));
return hits;
"""

# each scatter trace of every figure: its name, legend group and colour (line, else marker, else marker outline)
_COLOURS_JS = """
return Array.from(document.querySelectorAll('.figure')).flatMap(f => {
  const d = f.querySelector('.plotly-graph-div');
  return d.data.filter(t => (t.type || 'scatter').startsWith('scatter')).map(t => {
    const c = [t.line && t.line.color, t.marker && t.marker.color, t.marker && t.marker.line && t.marker.line.color]
      .find(v => typeof v === 'string');
    return [f.dataset.figure, t.name || '', t.legendgroup || '', c || null]; });
});
"""


def _layout_report(tmp_path) -> Path:
    """A small report with every section the layout test looks at: trajectories of two runs, the
    explain tables (the quantizers table is the widest), correlations with long notes, a live
    monitor, a quantization plane and the runs' landscape."""
    from losslens.study import analysis
    from losslens.study.report.explain_figures import synthetic_explain
    from losslens.study.report.figures import synthetic_results
    from losslens.study.report.pages import build_report

    df = synthetic_explain(synthetic_results(n_checkpoints=6, runs=("wsd", "cosine")))
    meta = {"settings": {"every": 100, "time_budget": 0.1}, "skipped_for_time": 2, "skipped_steps": [200, 300]}
    live = df[(df["run"] == "wsd") & df["step"].isin([100, 400, 500, 600])]
    return build_report(
        df,
        tmp_path / "layout.html",
        correlations=analysis.summary(df, n_boot=50),
        surfaces={"wsd-step600: A=Θ_K, B=Θ_K−1, C=rtn:4:g128": _tiny_surface()},
        landscape=_tiny_landscape(),
        live={"wsd, measured every 100 steps": {"results": live, "monitor": meta}},
        title="losslens layout test",
    )


def test_report_layout_fits_the_window_without_overlaps_and_keeps_run_colours(driver, tmp_path):
    """Issue 49: at 1280 px (and 1920 px) the page does not scroll sideways (the quantizers table was
    2,429 px wide), no title, axis title, subplot title or legend of the landscape and the
    quantization planes overlaps another (the landscape's subtitle sat on "surface"), no legend sits
    on x tick labels in any figure, and a run has one colour in every figure."""
    out = _layout_report(tmp_path)
    for width in (1280, 1920):
        driver.set_window_size(width, 1000)
        driver.get(out.resolve().as_uri())
        _wait_rendered(driver)
        scroll, inner = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert scroll <= inner, f"the page is {scroll} px wide in a {inner} px window"
        overlaps = {}
        for fig in driver.find_elements("css selector", ".figure"):
            name = fig.get_attribute("data-figure")
            hits = driver.execute_script(_OVERLAPS_JS, fig.find_element("css selector", ".plotly-graph-div"))
            titles = name == "landscape" or name.startswith("surface:")
            hits = hits if titles else [h for h in hits if h.startswith("legend × x tick")]
            if hits:
                overlaps[name] = hits
        assert not overlaps, f"at {width} px: {overlaps}"
    assert "landscape" in driver.execute_script(
        "return Array.from(document.querySelectorAll('.figure')).map(f => f.dataset.figure)"
    )
    colours: dict[str, set] = {}
    for figure, name, group, colour in driver.execute_script(_COLOURS_JS):
        if colour is None or name.startswith("LR") or "not converged" in name or "product error" in name:
            continue
        for run in ("wsd", "cosine"):
            if group == run or name == run or f"· {run}" in name or name.startswith(f"{run} ("):
                colours.setdefault(run, set()).add(colour)
    assert set(colours) == {"wsd", "cosine"} and all(len(c) == 1 for c in colours.values()), colours
    assert colours["wsd"] != colours["cosine"]
    note = driver.find_element("css selector", '[data-note="colours"]').text
    assert "One colour per run in every figure" in note and "wsd" in note and "cosine" in note
    assert "Skipped step(s) 200, 300" in driver.find_element("css selector", '[data-note="monitor"]').text

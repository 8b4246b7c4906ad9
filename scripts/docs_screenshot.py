#!/usr/bin/env python3
"""A screenshot of a losslens page for docs/: its top WIDTH × HEIGHT pixels in headless Chromium.

Usage: ``python scripts/docs_screenshot.py PAGE.html OUT.png [--width 1280] [--height 820]``

Opens the page in the browser test's headless Chromium (``tests/test_report_browser.py:
chromium_driver``; ``scripts/install-browser.sh`` installs it), waits until every Plotly figure has
rendered, and saves the viewport. docs/report.png is ``report.html`` of ``losslens demo --quick``
at 1280 × 1757; docs/surface.png the ``losslens surface`` page of the default demo's checkpoint
(README.md names the command) at 1280 × 820.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=820)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.test_report_browser import _wait_rendered, chromium_driver

    with chromium_driver() as driver:
        driver.set_window_size(a.width, a.height)
        driver.get(a.page.resolve().as_uri())
        _wait_rendered(driver)
        time.sleep(1.0)  # WebGL scenes draw a frame after the layout exists
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        # the window's frame takes some pixels: grow it until the viewport is WIDTH × HEIGHT
        driver.set_window_size(2 * a.width - inner[0], 2 * a.height - inner[1])
        time.sleep(1.0)
        driver.save_screenshot(str(a.out))
    print(f"{a.out}: {a.page} at {a.width} × {a.height}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

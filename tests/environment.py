"""Facts about the machine the suite runs on, shared by the tests that need a browser or CI.

``UNDER_CI``: ``$CI`` is set to true (``.ci/run``). There ``make test`` has installed the dev
extras and the system Chromium (``scripts/install-browser.sh``), so a test that needs them must
run and fail loudly when they are missing or broken, never skip.
``CHROMIUM`` / ``CHROMEDRIVER``: paths of the system browser and its WebDriver, or None.
"""

from __future__ import annotations

import os
import shutil

UNDER_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _first(*candidates: str | None) -> str | None:
    return next((p for p in candidates if p and os.path.exists(p)), None)


CHROMIUM = _first("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
CHROMEDRIVER = _first("/usr/bin/chromedriver", shutil.which("chromedriver"))

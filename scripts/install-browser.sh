#!/usr/bin/env bash
# Install a headless-capable Chromium and its WebDriver (Debian packages `chromium` and
# `chromium-driver`) for the browser test (tests/test_report_browser.py) and kaleido PNG export.
#
# Idempotent and non-interactive: does nothing when /usr/bin/chromium and /usr/bin/chromedriver
# already exist. Needs root (or passwordless sudo) and apt-get. Never fails the caller: when the
# browser cannot be installed it prints a warning and exits 0. The browser and PNG-export tests
# then skip with a reason on a developer's machine, and FAIL under CI (CI=true), where the
# browser is required.
set -u

log()  { echo "[install-browser] $*"; }
warn() { echo "[install-browser] WARNING: $*" >&2; }

have_browser() {
    { command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } &&
    { command -v chromedriver >/dev/null 2>&1 || [ -x /usr/bin/chromedriver ]; }
}

if have_browser; then
    log "chromium and chromedriver already installed: $(command -v chromium || echo /usr/bin/chromium), $(command -v chromedriver || echo /usr/bin/chromedriver)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    warn "apt-get not found (not a Debian/Ubuntu system); install chromium + chromedriver yourself. Browser tests will be skipped (and fail under CI=true)."
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        warn "not root and no passwordless sudo; cannot install chromium. Browser tests will be skipped (and fail under CI=true)."
        exit 0
    fi
fi

export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
if ! $SUDO apt-get update -qq; then
    warn "apt-get update failed (offline?); browser tests will be skipped (and fail under CI=true)."
    exit 0
fi
log "apt-get install chromium chromium-driver"
if ! $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation; then
    # Ubuntu ships chromium as a snap stub; try the older package name as a last resort.
    if ! $SUDO apt-get install -y -qq --no-install-recommends chromium-browser chromium-chromedriver; then
        warn "could not install chromium/chromium-driver with apt-get; browser tests will be skipped (and fail under CI=true)."
        exit 0
    fi
fi

if have_browser; then
    log "installed: $(chromium --version 2>/dev/null || echo chromium), $(chromedriver --version 2>/dev/null | head -n1 || echo chromedriver)"
else
    warn "apt-get finished but chromium/chromedriver are still not on PATH; browser tests will be skipped (and fail under CI=true)."
fi
exit 0

# Two entry points, each doing all set-up on a fresh machine:
#   make demo   -> creates .venv, installs losslens (+ lm-eval, the eval extra), runs `losslens demo --out demo-out`
#   make test   -> creates .venv, installs losslens with dev extras (+ headless Chromium when
#                  possible), runs the test suite
#   make docs   -> the docs site (Sphinx, offline, strict) in docs/_build/html
#   make check  -> the house rules (ARCHITECTURE.md): module sizes, no import circles, geometry's imports;
#                  every measured number / "exact" claim of README.md names its test or benchmark row;
#                  the docs name only modules, files and imports that exist (scripts/check_docs_stale.py);
#                  ruff format --check and ruff check (one line length, 120)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_OUT ?= demo-out
PYTEST_ARGS ?=

.PHONY: demo test install install-dev bench gpu-check check clean docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# torch first, pinned, so no later step resolves a multi-GB CUDA build.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[eval]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-peers.txt
	$(BIN)/pip install -e '.[dev,eval,monitor]'
	$(BIN)/pip install --no-deps -r requirements-peers.txt
	$(BIN)/pip install jaxtyping mpmath
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/losslens demo --out $(DEMO_OUT)

# The browser and PNG-export tests need Debian's chromium + chromedriver; the script installs them
# when it can (root or sudo, apt-get) and otherwise warns; those tests then skip with the reason,
# except under CI (CI=true), where they fail.
test: $(VENV)/.installed-dev
	bash scripts/install-browser.sh
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev
	$(BIN)/losslens bench all

# The one-command GPU check (benchmarks/gpu): every section within an 8-minute budget on one CUDA device;
# rows in gpu-check.json, the markdown table in gpu-check.md (for benchmarks/README.md).
gpu-check: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks.gpu --json gpu-check.json --markdown gpu-check.md

# The docs site: offline (no intersphinx), strict (-W: every warning fails; -n: every reference must
# resolve). tests/test_docs.py runs the same build in the test suite.
docs: $(VENV)/.installed-dev
	$(BIN)/python -m sphinx -E -W --keep-going -n -q -b html docs docs/_build/html

# The house rules of ARCHITECTURE.md (stdlib only), then the formatter and the linter (ruff, line length
# 120, pyproject.toml; from the dev environment). tests/test_house.py and tests/test_format.py run the same.
check: $(VENV)/.installed-dev
	$(PYTHON) scripts/check_house.py
	$(PYTHON) scripts/check_doc_claims.py README.md
	$(PYTHON) scripts/check_docs_stale.py
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(DEMO_OUT)

# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# `make lint` checks format, lint, types and the layering; `make test-fast`
# runs the unit tests only (no servers, workers, moto or Azurite).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
AZURITE := node_modules/.bin/azurite
CHROMIUM := /usr/bin/chromium

.PHONY: demo test test-fast lint proto proto-check venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(AZURITE):
	npm install --no-save --no-audit --no-fund --silent azurite@3

# The dashboard's browser tests drive Debian's chromium through Playwright (never `playwright install`).
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

test: $(STAMP) $(AZURITE) $(CHROMIUM)
	$(PY) -m cantata.proto.codegen --check
	PATH="$(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$$PATH" $(PY) -m pytest -q --durations=20

test-fast: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -m "not integration"

# Every check runs, so that one run reports all that fails.
lint: $(STAMP)
	@status=0; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m ruff check . || status=1; \
	$(PY) scripts/typecheck.py || status=1; \
	$(PY) scripts/layering.py || status=1; \
	exit $$status

proto: $(STAMP)
	$(PY) -m cantata.proto.codegen

clean:
	rm -rf $(VENV) node_modules .demo

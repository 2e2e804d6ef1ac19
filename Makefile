# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
AZURITE := node_modules/.bin/azurite

.PHONY: demo test proto proto-check venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(AZURITE):
	npm install --no-save --no-audit --no-fund --silent azurite@3

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

test: $(STAMP) $(AZURITE)
	$(PY) -m cantata.proto.codegen --check
	PATH="$(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$$PATH" $(PY) -m pytest -q

proto: $(STAMP)
	$(PY) -m cantata.proto.codegen

clean:
	rm -rf $(VENV) node_modules .demo

# Every target runs inside .venv, which `make install` creates (idempotent).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= config/config.yaml
PARAMS ?=
WAIT ?=

.PHONY: install test local-run pipeline-definition deploy-pipeline start-pipeline \
        build-image push-image data bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

local-run: install
	$(BIN)/python -m local.run

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf build runs .pytest_cache

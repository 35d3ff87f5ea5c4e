# Every target runs inside .venv, which `make install` creates (idempotent).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= config/config.yaml
PARAMS ?=
WAIT ?=
EXPERIMENT ?=
YES ?=
# `make pipeline-definition` works before config/config.yaml exists.
DEFINITION_CONFIG = $(if $(wildcard $(CONFIG)),$(CONFIG),config/config.yaml.example)
IMAGE_NAME ?= dapo-steps
IMAGE_TAG ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: install test local-run pipeline-definition deploy-pipeline start-pipeline sessions stop-orphans \
        build-image push-image data bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

local-run: install
	$(BIN)/python -m local.run

# The definition SageMaker receives, built offline (no AWS call at all).
pipeline-definition: install
	$(BIN)/python -m pipeline.definition --config $(DEFINITION_CONFIG) --out build/pipeline.json

deploy-pipeline: install
	$(BIN)/python -m pipeline.deploy --config $(CONFIG)

# PARAMS="BatchSize=64 MaxSteps=30" overrides parameters; WAIT=1 follows the execution;
# EXPERIMENT=name logs this execution to that MLflow experiment (needs pipeline.mlflow_tracking_arn).
start-pipeline: install
	$(BIN)/python -m pipeline.start --config $(CONFIG) $(foreach p,$(PARAMS),--param $(p)) \
		$(if $(EXPERIMENT),--mlflow-experiment $(EXPERIMENT)) $(if $(WAIT),--wait)

# The pipeline's training sessions: owner job, attempt, status, age.
sessions: install
	$(BIN)/python -m pipeline.sessions --config $(CONFIG)

# Stops the Running sessions whose owning job is not running, after one question (YES=1 skips it).
stop-orphans: install
	$(BIN)/python -m pipeline.sessions --config $(CONFIG) --stop-orphans $(if $(YES),--yes)

# Needs Docker (not run in CI).
build-image: install
	docker build -f containers/Dockerfile -t $(IMAGE_NAME):$(IMAGE_TAG) .

# Needs Docker and the aws CLI; creates the ECR repository if missing.
push-image: build-image
	containers/push-image.sh $(IMAGE_NAME) $(IMAGE_TAG)

# Needs internet: GSM8K from the Hugging Face hub to the configured S3 prefixes.
data: install
	$(BIN)/python -m pip install --quiet -e '.[data]'
	$(BIN)/python -m pipeline.data --config $(CONFIG)

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf build runs .pytest_cache

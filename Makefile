# Every target runs inside .venv, which `make install` creates (idempotent).
# `make` alone (or `make help`) lists the targets: the `## ` text after each target's name.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= config/config.yaml
PARAMS ?=
RESUME ?=
VERBOSE ?=
WAIT ?=
EXPERIMENT ?=
YES ?=
SOURCE ?=
DATA ?=
TASK ?=
# The folder of your task.grader's module, baked into the image (containers/Dockerfile's task_code stage).
TASK_CODE ?=
# CONFIG=<file> given on the command line (or in the environment) serves every target: check-task, sample and
# local-run read it too (local-run's default stays config/local.yaml). LOCAL_CONFIG: its older name for local-run.
LOCAL_CONFIG ?=
GIVEN_CONFIG = $(or $(LOCAL_CONFIG),$(if $(filter file,$(origin CONFIG)),,$(CONFIG)))
# make sample: the adapter (a model package ARN, or a local run id) and what to ask it.
MODEL ?=
PROMPT ?=
N ?= 1
# make reevaluate: the execution to evaluate again; make local-run REEVALUATE=<run id>: its local twin.
EXECUTION ?=
REEVALUATE ?=
# make local-run REEVALUATE=<run id> EVAL_DATA=<.jsonl file or folder>: new held-out data for the re-evaluation.
EVAL_DATA ?=
# make reevaluate / make local-run REEVALUATE=<id> UPDATE_APPROVAL=1: the new verdict sets the package's approval
# status (without it, the verdict is recorded on the package and its status left as it is).
UPDATE_APPROVAL ?=
# `make pipeline-definition` works before config/config.yaml exists.
DEFINITION_CONFIG = $(if $(wildcard $(CONFIG)),$(CONFIG),config/config.yaml.example)
IMAGE_NAME ?= dapo-steps
IMAGE_TAG ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
MLFLOW_PORT ?= 5000

.DEFAULT_GOAL := help
# Messages name settings as typed here (DATA=, PARAMS="BatchSize=8"), not as the commands' options (steps/cli.py).
local-run check-task sample data deploy-pipeline start-pipeline reevaluate sessions stop-orphans: export DAPO_CALLER = make
.PHONY: help install test local-run check-task mlflow-ui pipeline-definition deploy-pipeline start-pipeline sessions \
        stop-orphans build-image push-image data bench clean sample reevaluate

help: ## this list (the default target)
	@echo "usage: make TARGET [VAR=value ...]"
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

install: $(STAMP) ## create .venv and install the pinned project (every target does this first)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install ## lint, then the whole offline test suite
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

# RESUME=<run-id> continues an interrupted or failed run (runs/<run-id>/) with the parameters it started with.
# REEVALUATE=<run id>: EvaluateModel and the gate again on that finished run, PARAMS="MinImprovement=0.1" changed,
# EVAL_DATA=<file or dir> new held-out questions (those the adapter trained on are removed).
local-run: install ## the pipeline here, offline; PARAMS="MaxSteps=5", DATA=dir TASK=name CONFIG=file, RESUME=<id>
	$(BIN)/python -m local.run $(foreach p,$(PARAMS),--param $(p))$(if $(DATA), --data $(DATA))$(if $(TASK), --task $(TASK))$(if $(GIVEN_CONFIG), --config $(GIVEN_CONFIG))$(if $(REEVALUATE), --reevaluate $(REEVALUATE))$(if $(RESUME), --resume $(RESUME))$(if $(VERBOSE), --verbose)$(if $(EVAL_DATA), --eval-data $(EVAL_DATA))$(if $(UPDATE_APPROVAL), --update-approval)

# Without DATA, a few generated toy rows (GSM8K's format) stand in.
check-task: install ## three prompts of DATA=dir and the grader's verdict on their gold answers (TASK=name), offline
	$(if $(DATA),,$(BIN)/python -m local.toy_data --out build/check-task --train 20 --eval 5 >/dev/null)
	$(BIN)/python -m steps.tasks --check --config $(or $(GIVEN_CONFIG),$(wildcard $(CONFIG)),config/default.yaml) \
		--data $(or $(DATA),build/check-task) $(if $(TASK),--task $(TASK))

mlflow-ui: install ## the local runs' MLflow store (runs/mlflow.db) at http://127.0.0.1:5000 (MLFLOW_PORT=...)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/runs/mlflow.db --host 127.0.0.1 --port $(MLFLOW_PORT)

# Built offline: no AWS call at all.
pipeline-definition: install ## write build/pipeline.json, the definition SageMaker receives (no AWS call)
	$(BIN)/python -m pipeline.definition --config $(DEFINITION_CONFIG) --out build/pipeline.json

deploy-pipeline: install ## create or update the pipeline from CONFIG (default config/config.yaml)
	$(BIN)/python -m pipeline.deploy --config $(CONFIG)

# EXPERIMENT=name logs this execution to that MLflow experiment (needs pipeline.mlflow_tracking_arn).
start-pipeline: install ## start an execution; PARAMS="BatchSize=64 MaxSteps=30" overrides, WAIT=1 follows it
	$(BIN)/python -m pipeline.start --config $(CONFIG) $(foreach p,$(PARAMS),--param $(p)) \
		$(if $(EXPERIMENT),--mlflow-experiment $(EXPERIMENT)) $(if $(WAIT),--wait)

# A model package ARN samples on AWS (a session created and stopped, CONFIG's session settings); a local run id
# samples the local service started on that run's saved adapter.
sample: install ## try an adapter: MODEL=<model package ARN or local run id> PROMPT="..." [N=3]
	$(if $(MODEL),,$(error MODEL=<model package ARN or local run id> is required))
	$(if $(PROMPT),,$(error PROMPT="..." is required: the question to ask the adapter))
	$(BIN)/python -m $(if $(filter arn:%,$(MODEL)),pipeline.sample --config $(CONFIG) --model $(MODEL),local.sample \
		$(MODEL)) --n $(N) --prompt '$(subst ','\'',$(PROMPT))'

reevaluate: install ## EvaluateModel and the gate again, no training: EXECUTION=<arn> PARAMS=... [UPDATE_APPROVAL=1]
	$(if $(EXECUTION),,$(error EXECUTION=<pipeline execution ARN> is required (locally: make local-run REEVALUATE=<run id>)))
	$(BIN)/python -m pipeline.reevaluate --config $(CONFIG) --execution $(EXECUTION) \
		$(foreach p,$(PARAMS),--param $(p)) $(if $(UPDATE_APPROVAL),--update-approval) $(if $(WAIT),--wait)

sessions: install ## the pipeline's training sessions: status, age, owner job, attempt
	$(BIN)/python -m pipeline.sessions --config $(CONFIG)

stop-orphans: install ## stop the Running sessions whose owner job is not running (asks once; YES=1 skips it)
	$(BIN)/python -m pipeline.sessions --config $(CONFIG) --stop-orphans $(if $(YES),--yes)

build-image: install ## build the step image from containers/ (needs Docker; TASK_CODE=dir bakes in your grader)
	docker build -f containers/Dockerfile -t $(IMAGE_NAME):$(IMAGE_TAG) $(if $(TASK_CODE),--build-context task_code=$(TASK_CODE)) .

# Creates the ECR repository if missing.
push-image: build-image ## build and push the step image to ECR (needs Docker and the aws CLI)
	containers/push-image.sh $(IMAGE_NAME) $(IMAGE_TAG)

data: install ## GSM8K from the Hugging Face hub to the configured S3 (SOURCE=dir: your own JSONL files)
	$(if $(SOURCE),,$(BIN)/python -c 'import huggingface_hub, pyarrow' 2>/dev/null || \
		$(BIN)/python -m pip install --quiet -e '.[data]')
	$(BIN)/python -m pipeline.data --config $(CONFIG) $(if $(SOURCE),--source $(SOURCE))

bench: install ## the benchmarks; writes bench/results.json
	$(BIN)/python -m bench

clean: ## remove build/, runs/ and pytest's cache
	rm -rf build runs .pytest_cache

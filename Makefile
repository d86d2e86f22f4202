# Two commands on a fresh machine: `make synth` (set up + synthesize dev) and `make test` (set up + run the tests).
# Both are idempotent: set-up steps re-run only when their requirement files change.

VENV      := .venv
PY        := $(VENV)/bin/python
# Both images' PyTorch line (2.9): the XLA path on PyTorch/XLA's CPU device (tests/training/test_xla_path.py) and the
# training tests that matter on the images' torch (tests/training/test_image_torch_line.py).
XLA_VENV  := .venv-xla
# checkov, the IaC scanner gate (tools/gates.py): its pins conflict with .venv's (requirements-scan.txt says which).
SCAN_VENV := .venv-scan
# MLflow's server and web UI (`make tracking-ui`, tests/test_tracking_ui.py); the image and the tests need the client only.
TRACKING_VENV := .venv-tracking
TRACKING_PORT ?= 5000
NODE_BIN  := $(CURDIR)/node_modules/.bin
# The pinned Node 22 and CDK CLI come first, so nothing falls back to a global CLI or an end-of-life Node.
export PATH := $(NODE_BIN):$(PATH)

CDK_ARGS    ?=
PYTEST_ARGS ?=
# The suite runs one pytest-xdist worker per core of these 2-core machines.
PYTEST_WORKERS ?= 2
HOURS       ?= 24

DIAGRAM_ENV ?= prod

.PHONY: synth test test-fast lint setup deploy push-workload check-alerts destroy dataset local-run tracking-ui cost-report capacity quote bench diagram diagram-tree clean

setup: $(VENV)/.test-deps $(XLA_VENV)/.deps $(SCAN_VENV)/.deps $(TRACKING_VENV)/.deps node_modules/.installed

$(VENV)/.synth-deps: requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.synth-deps requirements-dev.txt training_image/requirements.txt
	@echo "setting up $(VENV)'s test toolchain once (torch CPU, moto, pytest; its size and time: README.md, Quick start)" >&2
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

$(XLA_VENV)/.deps: requirements-xla.txt
	@echo "setting up $(XLA_VENV) once (the images' PyTorch line; its size and time: README.md, Quick start)" >&2
	test -x $(XLA_VENV)/bin/python || python3 -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-xla.txt
	touch $@

$(SCAN_VENV)/.deps: requirements-scan.txt
	@echo "setting up $(SCAN_VENV) once (checkov; its size and time: README.md, Quick start)" >&2
	test -x $(SCAN_VENV)/bin/python || python3 -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-scan.txt
	touch $@

$(TRACKING_VENV)/.deps: requirements-tracking.txt
	@echo "setting up $(TRACKING_VENV) once (MLflow's server and UI; its size and time: README.md, Quick start)" >&2
	test -x $(TRACKING_VENV)/bin/python || python3 -m venv $(TRACKING_VENV)
	$(TRACKING_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-tracking.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.synth-deps node_modules/.installed
	cdk synth --quiet $(CDK_ARGS)
	$(PY) -m tools.synth_summary cdk.out

test: $(VENV)/.test-deps $(XLA_VENV)/.deps $(SCAN_VENV)/.deps $(TRACKING_VENV)/.deps node_modules/.installed lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The inner loop: the CDK, configuration, contract and unit tests, without the tests marked slow (real torchrun
# processes, the pipeline executed in moto, whole-app synthesis of every variant with its gates). Needs .venv only.
test-fast: $(VENV)/.test-deps node_modules/.installed
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

# The gates a newcomer gets for free (pyproject.toml configures them): lint, format, types, over the whole tree.
lint: $(VENV)/.test-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# One command per environment: checks Docker and credentials (one line each), bootstraps if needed, logs in to
# the base image's registry, deploys every stack. DRY_RUN=1 prints the plan (no Docker, no credentials needed);
# CDK_ARGS go to `cdk deploy`.
ENV ?= dev
# NO_PROMPT=1 for CI (never asks for approval); ALLOW_RUNNING=1 deploys even while a pipeline execution runs.
deploy: $(VENV)/.synth-deps node_modules/.installed
	$(PY) -m tools.deploy $(ENV) $(if $(DRY_RUN),--dry-run) $(if $(NO_PROMPT),--ci) \
		$(if $(ALLOW_RUNNING),--allow-running) $(if $(CDK_ARGS),-- $(CDK_ARGS))

# A workload's image: DIR's Dockerfile built FROM this tree's platform image, pushed to ENV's workload repository; prints
# its URI by digest (REGISTER=<declaration file>: registers the declaration with it). Needs Docker and credentials.
push-workload: $(VENV)/.synth-deps
	$(PY) -m tools.push_workload $(ENV) $(NAME) $(DIR) $(if $(REGISTER),--register $(REGISTER))

# The alert path proven: subscriptions in every state, then ENV's pipeline-broken alarm set to ALARM for a moment, so
# an e-mail shows alarm -> KMS -> SNS -> inbox works (DRY_RUN=1: the plan, no AWS call).
check-alerts: $(VENV)/.synth-deps
	$(PY) -m tools.check_alerts $(ENV) $(if $(DRY_RUN),--dry-run)

# Every stack of ENV in an order that ends clean; with retain_data it keeps the data and says how to remove it.
destroy: $(VENV)/.synth-deps node_modules/.installed
	$(PY) -m tools.destroy $(ENV) $(if $(DRY_RUN),--dry-run) $(if $(ALLOW_RUNNING),--allow-running) \
		$(if $(CDK_ARGS),-- $(CDK_ARGS))

# A dataset for ENV's runs: NAME=<name> and INPUT=<text files or folders> (FORMAT=criteo for click logs), or SYNTHETIC=1
# for a small generated corpus; uploads to datasets/<name>/ and prints a run file (DRY_RUN=1: prepare only).
dataset: $(VENV)/.test-deps
	$(PY) -m tools.dataset $(ENV) $(NAME) $(if $(INPUT),--input $(INPUT)) $(if $(SYNTHETIC),--synthetic) \
		$(if $(FORMAT),--format $(FORMAT)) $(if $(DRY_RUN),--dry-run)

# LOCAL_MODEL=ctr-tiny runs the sparse click-through model on parameter servers instead of the GPT; WORKLOAD=<name>
# runs a declared workload (cdk.json, or an example: torch-ddp) through sanity, train, validate and approval
# (HYPERPARAMETERS='<JSON>' checked against its schema).
LOCAL_MODEL ?= tiny
local-run: $(VENV)/.test-deps
ifdef WORKLOAD
	$(PY) -m tools.local_workload $(WORKLOAD) --out local-run --env $(ENV) \
		$(if $(HYPERPARAMETERS),--hyperparameters '$(HYPERPARAMETERS)')
else
	$(PY) training_image/local_run.py --out local-run --model $(LOCAL_MODEL)
endif

# MLflow's own web UI over the last local run's store (make local-run writes local-run/mlflow.db): every run, its
# parameters and metrics by step, and the verdict, at http://localhost:$(TRACKING_PORT): it prints each experiment's
# Runs page first (MLflow 3 opens on its GenAI overview).
tracking-ui: $(TRACKING_VENV)/.deps
	@test -f local-run/mlflow.db || { echo "make tracking-ui: no local-run/mlflow.db yet; run make local-run first" >&2; exit 2; }
	$(TRACKING_VENV)/bin/python -m tools.tracking_ui --store sqlite:///$(CURDIR)/local-run/mlflow.db --port $(TRACKING_PORT)

cost-report: $(VENV)/.synth-deps
	$(PY) -m tools.cost_report --all --hours $(HOURS)

# Capacity Block or training-plan offerings that hold ENV's nodes for HOURS (needs AWS credentials; buys nothing).
capacity: $(VENV)/.synth-deps
	$(PY) -m tools.capacity --env $(ENV) --hours $(HOURS)

quote: $(VENV)/.synth-deps
	$(PY) -m tools.pipeline_cli quote $(ENV) $(RUN)

bench: $(VENV)/.test-deps node_modules/.installed
	$(PY) benchmarks/synth_ratio.py
	$(PY) benchmarks/launcher_overhead.py
	$(PY) benchmarks/hang_to_end.py

# The pictures, drawn from the app synthesized for DIAGRAM_ENV, each with the model it drew (tests/test_diagram.py
# fails when the app's model differs: redraw then): per backend,
# docs/architecture-<env>-<compute>.png (stacks and main resources) and docs/pipeline-<env>-<compute>.png (states and
# failure paths) by tools/diagram, and docs/architecture-tree-<env>.png (every construct) by cdk-dia.
NEED_DOT = @command -v dot >/dev/null || { echo "error: Graphviz is missing; install it with: apt-get install -y graphviz"; exit 1; }

tools/diagram/node_modules/.installed: tools/diagram/package.json tools/diagram/package-lock.json
	npm ci --prefix tools/diagram --no-audit --no-fund --loglevel=error
	touch $@

diagram: $(VENV)/.test-deps node_modules/.installed diagram-tree
	$(NEED_DOT)
	$(PY) -m tools.diagram --env $(DIAGRAM_ENV) --out docs

diagram-tree: $(VENV)/.test-deps node_modules/.installed tools/diagram/node_modules/.installed
	$(NEED_DOT)
	cdk synth --quiet -c env=$(DIAGRAM_ENV) --output build/diagram-$(DIAGRAM_ENV)
	tools/diagram/node_modules/.bin/cdk-dia --tree build/diagram-$(DIAGRAM_ENV)/tree.json \
		--target docs/architecture-tree-$(DIAGRAM_ENV).png
	$(PY) -m tools.diagram.shrink docs/architecture-tree-$(DIAGRAM_ENV).png

clean:
	rm -rf cdk.out build local-run .pytest_cache

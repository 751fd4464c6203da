# streamq: `make help` lists the targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install module system-packages redis-server check test coverage chaos lint type bench bench-peers demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

system-packages: ## install redis-server, tmux (terminal test), chromium (browser test) and gcc (the module) from Debian when missing
	@command -v redis-server >/dev/null && command -v tmux >/dev/null && command -v chromium >/dev/null && command -v $(CC) >/dev/null || { \
	  echo "installing redis-server, tmux, chromium and gcc with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server tmux chromium gcc libc6-dev >/dev/null; }

redis-server: system-packages ## the Debian packages the tests need (system-packages)

MODULE := module/streamq-module.so

$(MODULE): module/streamq_module.c
	$(CC) -O2 -Wall -Wextra -std=c99 -fPIC -shared -o $@ $<

module: $(MODULE) ## streamq's Redis module (SQ.FCALL: roles with no write command of their own)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,dev,spark,otel,web]'
	touch $(STAMP)

install: system-packages $(STAMP) $(MODULE) ## create .venv with streamq, test and dev tools, and the module

#: parallel test processes: each starts its own servers on its own free ports
TEST_WORKERS ?= 4

check: install ## the quick tiers: unit (no server) and scripts (one redis-server), in parallel
	$(BIN)/python -m pytest -q -n 2 tests/unit tests/scripts

#: byte-compiled once: the tests start hundreds of Python processes, each of which
#: would compile streamq again where PYTHONDONTWRITEBYTECODE is set
PRECOMPILE = $(BIN)/python -m compileall -q -j 0 streamq tests

test: install lint ## the lint, then every tier (unit, scripts, integration, system), in parallel, on private servers
	$(PRECOMPILE)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

coverage: install ## make test under coverage.py: branch coverage of streamq, worker processes included
	$(BIN)/python -m coverage erase
	$(PRECOMPILE)
	-$(BIN)/python -m coverage run -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report --format=total | sed 's/^/branch coverage, percent: /'
	$(BIN)/python -m coverage report --sort=cover | tail -n 25

chaos: install ## the fault suite: 3 min of kills, Redis restarts and lost replies, then the invariants
	$(BIN)/python -m tests.chaos --duration 180

lint: install ## ruff, and the floors of the code (import-linter's contracts in pyproject.toml)
	$(BIN)/ruff check streamq tests
	$(BIN)/lint-imports

type: install ## mypy --strict
	$(BIN)/mypy

bench: install bench-peers ## benchmarks: streamq against raw redis-py, and its peers, on the same server
	$(BIN)/python tests/bench/bench_peers.py
	$(BIN)/python tests/bench/bench_core.py
	$(BIN)/python tests/bench/bench_small.py
	$(BIN)/python tests/bench/bench_costs.py
	$(BIN)/python tests/bench/bench_guard.py
	$(BIN)/python tests/bench/bench_slow.py
	$(BIN)/python tests/bench/bench_durability.py
	$(BIN)/python tests/bench/bench_module.py
	$(BIN)/python tests/bench/bench_tracing.py
	$(BIN)/python tests/bench/bench_spark.py
	$(BIN)/python tests/bench/bench_cluster.py
	$(BIN)/python tests/bench/bench_cluster_pipeline.py
	$(BIN)/python tests/bench/bench_web.py

bench-peers: install ## the peers bench_peers.py runs beside streamq: Dramatiq (pip), BullMQ (npm; skipped without Node)
	$(BIN)/pip install --quiet "dramatiq[redis]==2.2.1"
	@if command -v npm >/dev/null; then cd tests/bench/peers && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "no npm: BullMQ's row is skipped"; fi

demo: install ## the main job: a Spark pipeline through streamq on a private Redis
	$(BIN)/python -m streamq.spark.demo

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(MODULE)

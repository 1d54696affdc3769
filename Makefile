# taskhandler-operator developer entry points.
#   make demo   run the product end to end on the embedded default
#   make test   lint, type-check, then the whole test suite (what .ci/run calls)
# Every target installs what it needs, idempotently.

PYTHON   ?= python3
VENV     ?= .venv
# Same default as hack/*.sh and the fixtures: honour XDG_CACHE_HOME.
THOP_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/taskhandler-operator
export THOP_CACHE

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test lint typecheck unit mutation venv system-deps k8s-bins airflow-venv clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

system-deps:
	@bash hack/system-deps.sh

k8s-bins:
	@bash hack/build-k8s.sh

airflow-venv:
	@bash hack/airflow-venv.sh

demo: venv system-deps airflow-venv
	$(BIN)/python hack/demo.py

lint: venv
	$(BIN)/ruff check operator tests benchmarks hack
	$(BIN)/ruff format --check operator tests benchmarks hack

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit

test: venv system-deps k8s-bins airflow-venv lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# Opt-in, slow (not part of `make test`): mutate the pure cores one operator at a time and
# run the unit tests against each mutant. MUTANTS narrows it, e.g.
#   make mutation MUTANTS='taskhandler_operator.protocol.summary*'
# Scores per module: docs/mutation-testing.md.
mutation: venv
	rm -rf mutants
	ln -sfn operator src
	$(BIN)/mutmut run $(MUTANTS); status=$$?; rm -f src; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info operator/*.egg-info mutants

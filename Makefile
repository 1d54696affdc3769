# taskhandler-operator developer entry points.
#   make demo   install the chart on a local control plane and bind three example bundles
#   make test   lint, type-check, then the whole test suite (what .ci/run calls)
#   make chaos  the fault tests of tests/chaos, long variants included (not part of make test)
# Every target installs what it needs, idempotently.

PYTHON   ?= python3
VENV     ?= .venv
# Same default as hack/*.sh and the fixtures: honour XDG_CACHE_HOME.
THOP_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/taskhandler-operator
export THOP_CACHE

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml devenv/pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test chaos lint typecheck unit mutation venv fuzz system-deps k8s-bins versitygw kstatus airflow-venv node-venv clean \
	chart-files kind-up kind-images kind-postgres kind-airflow-schema kind-install kind-examples kind-down

# The operator and, beside it, the development environment (devenv/: control plane, servers,
# demo data) the demo, tests and benchmarks use; the operator's wheel and images hold neither.
$(STAMP): pyproject.toml devenv/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]' -e ./devenv
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

system-deps:
	@bash hack/system-deps.sh

k8s-bins:
	@bash hack/build-k8s.sh

# The S3-compatible server the source tests run against (built from its Go module, cached).
versitygw:
	@bash hack/build-versitygw.sh

# kstatus' own verdict (sigs.k8s.io/cli-utils status.Compute) for the health tests (cached).
kstatus:
	@bash hack/build-kstatus.sh

airflow-venv:
	@bash hack/airflow-venv.sh

# The venv probe pods run from on the process node (non-root, outside /root).
node-venv: system-deps
	@bash hack/node-venv.sh >/dev/null

# The script itself builds what else it needs (Kubernetes binaries, Airflow side venv, node venv,
# test runtimes), after stating the one-time cost and with progress shown.
demo: venv system-deps
	$(BIN)/python hack/demo.py $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check operator devenv tests benchmarks hack
	$(BIN)/ruff format --check operator devenv tests benchmarks hack
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit

test: venv system-deps k8s-bins versitygw kstatus airflow-venv node-venv lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# The fault tests of tests/chaos, long variants included (the `chaos` marker, which the default
# run deselects; about 20 min). THOP_CHAOS_SEED=<n> replays a run's random fault moments.
chaos: venv system-deps k8s-bins versitygw airflow-venv node-venv
	$(BIN)/pytest -m "chaos or not chaos" tests/chaos $(PYTEST_ARGS)

# Opt-in, slow (not part of `make test`): mutate the pure cores one operator at a time and
# run the unit tests against each mutant. MUTANTS narrows it, e.g.
#   make mutation MUTANTS='taskhandler_operator.protocol.summary*'
# Scores per module: docs/mutation-testing.md.
mutation: venv
	rm -rf mutants
	ln -sfn operator src
	$(BIN)/mutmut run $(MUTANTS); status=$$?; rm -f src; exit $$status

# Opt-in (not part of `make test`): hypothesis at a large budget against every artifact reader,
# the frame decoder, the termination-message/result parsers and the CR spec validation.
# FUZZ_EXAMPLES sets examples per target (default 2000); docs/fuzzing.md.
FUZZ_EXAMPLES ?= 2000
fuzz: venv
	THOP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/fuzz -m fuzz -p no:cacheprovider \
	  --hypothesis-show-statistics -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache build *.egg-info operator/*.egg-info devenv/*.egg-info devenv/build mutants

# Regenerate the chart's copies of generated files (unit tests fail when they drift).
chart-files: venv
	$(BIN)/taskhandler-operator crd > crds/taskhandlerbundles.langsdk.dev.yaml
	cp crds/taskhandlerbundles.langsdk.dev.yaml charts/taskhandler-operator/files/crd.yaml
	$(BIN)/taskhandler-operator rbac > charts/taskhandler-operator/files/rbac-rules.yaml
	$(BIN)/python -m tests.unit.chart.values_doc

# --- For people with Docker and kind (docs/install.md); not run in CI. ----------------------
KIND_CLUSTER ?= taskhandler
IMAGE_TAG    ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/taskhandler-operator/Chart.yaml)
IMAGE_REPO   ?= ghcr.io/langsdk
THOP_NS      ?= taskhandler-system

kind-up:
	kind create cluster --config kind-config.yaml --name $(KIND_CLUSTER)

kind-images:
	docker build -f images/operator/Dockerfile -t $(IMAGE_REPO)/taskhandler-operator:$(IMAGE_TAG) .
	docker build -f images/probe-java/Dockerfile -t $(IMAGE_REPO)/taskhandler-probe-java:$(IMAGE_TAG) .
	docker build -f images/probe-node/Dockerfile -t $(IMAGE_REPO)/taskhandler-probe-node:$(IMAGE_TAG) .
	kind load docker-image --name $(KIND_CLUSTER) $(IMAGE_REPO)/taskhandler-operator:$(IMAGE_TAG) \
	  $(IMAGE_REPO)/taskhandler-probe-java:$(IMAGE_TAG) $(IMAGE_REPO)/taskhandler-probe-node:$(IMAGE_TAG)

kind-postgres:
	kubectl create namespace airflow --dry-run=client -o yaml | kubectl apply -f -
	kubectl apply -f hack/kind/postgres.yaml
	kubectl -n airflow rollout status statefulset/postgres --timeout=180s

# Airflow's own schema, created by Airflow itself (make airflow-venv) through a port-forward.
kind-airflow-schema: airflow-venv
	kubectl -n airflow port-forward svc/postgres 15432:5432 & pf=$$!; sleep 3; \
	  AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://airflow:airflow@127.0.0.1:15432/airflow \
	  $$(ls -d $(THOP_CACHE)/airflow-[0-9]*/ | head -1)bin/airflow db migrate; rc=$$?; kill $$pf; exit $$rc

kind-install:
	kubectl create namespace $(THOP_NS) --dry-run=client -o yaml | kubectl apply -f -
	kubectl -n $(THOP_NS) create secret generic airflow-db \
	  --from-literal=url=postgresql+psycopg://airflow:airflow@postgres.airflow.svc:5432/airflow \
	  --dry-run=client -o yaml | kubectl apply -f -
	helm upgrade --install thop charts/taskhandler-operator -n $(THOP_NS) \
	  --set database.existingSecret=airflow-db --set image.pullPolicy=Never --wait

kind-examples:
	kubectl apply -f examples/secrets.yaml -f examples/go-git.yaml
	kubectl get thb

kind-down:
	kind delete cluster --name $(KIND_CLUSTER)

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

.PHONY: demo test chaos lint typecheck unit mutation venv fuzz system-deps k8s-bins node-bins versitygw kstatus promtool airflow-venv node-venv images buildkit clean \
	chart-files install-manifests requirements-lock kind-up kind-images kind-postgres kind-airflow kind-install kind-examples kind-down

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

# The real node: kubelet, kube-scheduler, containerd, runc, pause (Go modules + gcc, cached).
node-bins: system-deps
	@bash hack/build-node.sh

# The S3-compatible server the source tests run against (built from its Go module, cached).
versitygw:
	@bash hack/build-versitygw.sh

# kstatus' own verdict (sigs.k8s.io/cli-utils status.Compute) for the health tests (cached).
kstatus:
	@bash hack/build-kstatus.sh

# Prometheus' promtool (its Go module, cached): checks the chart's alert rules and evaluates them
# against the operator's real /metrics output.
promtool:
	@bash hack/build-promtool.sh

# BuildKit (buildkitd, buildctl) and its runc, from their Go modules (cached).
buildkit: system-deps
	@bash hack/build-buildkit.sh >/dev/null

# images/Dockerfile's three images as OCI archives, without a registry (cached by content;
# docs/images.md, "Images without a registry"). Prints `image <ref> <archive>` lines.
images: venv system-deps buildkit
	@bash hack/build-images.sh

airflow-venv:
	@bash hack/airflow-venv.sh

# The venv probe pods run from on the process node (non-root, outside /root).
node-venv: system-deps
	@bash hack/node-venv.sh >/dev/null

# The script itself builds what else it needs (Kubernetes binaries, Airflow side venv, node venv,
# test runtimes; for the real node BuildKit and the images), after stating the one-time cost and
# with progress shown. The real node's binaries come first when it may run (as root, unless
# DEMO_ARGS asks for the process node); the script falls back to the process node without them.
DEMO_NODE_BINS := $(if $(and $(filter 0,$(shell id -u)),$(if $(findstring process,$(DEMO_ARGS)),,y)),node-bins)
demo: venv system-deps $(DEMO_NODE_BINS)
	$(BIN)/python hack/demo.py $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check operator devenv tests benchmarks hack
	$(BIN)/ruff format --check operator devenv tests benchmarks hack
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit

test: venv system-deps k8s-bins node-bins images versitygw kstatus promtool airflow-venv node-venv lint typecheck
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

# The install without Helm: deploy/install.yaml and deploy/kustomize/base/ rendered from the chart
# with the real helm (hack/render_install.py); a test fails when they drift from the chart.
install-manifests: venv k8s-bins
	$(BIN)/python hack/render_install.py

# Re-resolve images/requirements.txt, the hash-locked runtime dependencies the images install,
# from pyproject.toml (needs the package index; tests/unit/test_requirements_lock.py checks it).
requirements-lock: venv
	VENV=$(VENV) bash hack/lock-requirements.sh

# --- For people with Docker and kind (docs/install.md); not run in CI. ----------------------
# Needs kind, docker, kubectl and helm, plus what `make demo` needs to build the example bundles
# (Go, a JDK, Node.js). In order: kind-up kind-images kind-postgres kind-airflow kind-install
# kind-examples; the bundles end Ready. hack/kind/examples/ is also what `make demo` applies.
KIND_CLUSTER ?= taskhandler
# The chart's appVersion: the images' tag and their org.opencontainers.image.version label.
APP_VERSION  := $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/taskhandler-operator/Chart.yaml)
IMAGE_TAG    ?= $(APP_VERSION)
IMAGE_REPO   ?= ghcr.io/langsdk
# The commit the images are built from (their org.opencontainers.image.revision label).
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
THOP_NS      ?= taskhandler-system
# One Dockerfile, one target per image; the build and base stages are shared (and cached).
IMAGE_BUILD   = docker build -f images/Dockerfile --build-arg VERSION=$(IMAGE_TAG) \
	--build-arg REVISION=$(REVISION)
EXAMPLES_NS  := thop-demo
ORDERS       := $(BIN)/python -m taskhandler_devenv.orders_cluster

kind-up:
	kind create cluster --config kind-config.yaml --name $(KIND_CLUSTER)

# The images the chart's defaults name (ghcr.io/langsdk/*:<appVersion>), loaded into the nodes.
kind-images:
	$(IMAGE_BUILD) --target operator -t $(IMAGE_REPO)/taskhandler-operator:$(IMAGE_TAG) .
	$(IMAGE_BUILD) --target probe-java -t $(IMAGE_REPO)/taskhandler-probe-java:$(IMAGE_TAG) .
	$(IMAGE_BUILD) --target probe-node -t $(IMAGE_REPO)/taskhandler-probe-node:$(IMAGE_TAG) .
	kind load docker-image --name $(KIND_CLUSTER) $(IMAGE_REPO)/taskhandler-operator:$(IMAGE_TAG) \
	  $(IMAGE_REPO)/taskhandler-probe-java:$(IMAGE_TAG) $(IMAGE_REPO)/taskhandler-probe-node:$(IMAGE_TAG)

kind-postgres:
	kubectl create namespace airflow --dry-run=client -o yaml | kubectl apply -f -
	kubectl apply -f hack/kind/postgres.yaml
	kubectl -n airflow rollout status statefulset/postgres --timeout=180s

# Airflow's own schema and the example Dag orders_etl with its stub tasks, written by Airflow
# itself (the side venv of make airflow-venv) through a port-forward: what `make demo` seeds.
kind-airflow: venv airflow-venv
	kubectl -n airflow port-forward svc/postgres 15432:5432 & pf=$$!; sleep 3; \
	  $(ORDERS) seed --database-url postgresql+psycopg://airflow:airflow@127.0.0.1:15432/airflow; \
	  rc=$$?; kill $$pf; exit $$rc

# The bundles' namespace first: the chart puts its probe ServiceAccount and NetworkPolicy there.
kind-install:
	kubectl apply -f hack/kind/examples/namespace.yaml
	kubectl create namespace $(THOP_NS) --dry-run=client -o yaml | kubectl apply -f -
	kubectl -n $(THOP_NS) create secret generic airflow-db \
	  --from-literal=url=postgresql+psycopg://airflow:airflow@postgres.airflow.svc:5432/airflow \
	  --dry-run=client -o yaml | kubectl apply -f -
	helm upgrade --install thop charts/taskhandler-operator -n $(THOP_NS) \
	  --set database.existingSecret=airflow-db --set image.pullPolicy=Never \
	  --set probe.imagePullPolicy=Never --set 'probe.namespaces={$(THOP_NS),$(EXAMPLES_NS)}' --wait

# The in-cluster git server, the three test runtimes built and pushed to it through a
# port-forward (and registered in Airflow's dag_bundle table at that commit, as the dag
# processor would), then the three bundles; waits until they are Ready.
kind-examples: venv
	kubectl apply -f hack/kind/examples/namespace.yaml
	kubectl -n $(EXAMPLES_NS) get secret git-auth >/dev/null 2>&1 || \
	  kubectl -n $(EXAMPLES_NS) create secret generic git-auth --from-literal=username=demo \
	    --from-literal=password=$$(openssl rand -hex 16)
	kubectl apply -f hack/kind/examples/git-server.yaml
	kubectl -n $(EXAMPLES_NS) rollout status deployment/bundle-git-server --timeout=180s
	kubectl -n $(EXAMPLES_NS) port-forward svc/bundle-git-server 18080:80 & pf=$$!; \
	  kubectl -n airflow port-forward svc/postgres 15432:5432 & pg=$$!; sleep 3; \
	  THOP_GIT_PASSWORD=$$(kubectl -n $(EXAMPLES_NS) get secret git-auth -o jsonpath='{.data.password}' | base64 -d) \
	  $(ORDERS) push --url http://127.0.0.1:18080/orders-bundles.git \
	    --database-url postgresql+psycopg://airflow:airflow@127.0.0.1:15432/airflow; \
	  rc=$$?; kill $$pf $$pg; exit $$rc
	kubectl apply -f hack/kind/examples/bundles.yaml
	kubectl -n $(EXAMPLES_NS) wait thb --all --for=condition=Ready --timeout=300s
	kubectl -n $(EXAMPLES_NS) get thb

kind-down:
	kind delete cluster --name $(KIND_CLUSTER)

# Flash-sale platform: developer commands. `make` (or `make help`) lists them.
# Each target's `## text` is its help line; add new targets the same way.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENV_DIR ?= /tmp/flashsale-env

.PHONY: help demo setup build lint test test-unit faults mutants bench env-up env-down chart-lint chart-sync images

help: ## List the targets
	@echo "Usage: make TARGET"
	@awk 'BEGIN { FS = ":.*## " } /^##@ / { printf "\n%s\n", substr($$0, 5) } \
		/^[a-zA-Z0-9_.-]+:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

##@ Run

demo: ## A whole sale end to end on this machine: servers, operator, runtime, buyers, checked summary (docs/demo.md)
	bash scripts/demo.sh $(DEMO_ARGS)

##@ Setup and build

setup: ## Install system packages and npm deps, build/cache the servers (Kafka jars, etcd, kube-apiserver, kubectl, helm)
	bash test/env/deps.sh all

build: ## Compile the production sources (core, runtime, operator, scripts/migrate.ts; tsconfig.build.json) into dist/
	npm run build

lint: ## eslint + prettier --check + tsc --noEmit
	npx eslint .
	npx prettier --check .
	npx tsc -p tsconfig.json --noEmit

##@ Tests

test: ## Run all tests against real servers (starts and stops them; same as CI)
	@bash test/run.sh

test-unit: ## Run the unit tests only (no servers)
	NODE_OPTIONS=--experimental-vm-modules npx jest --selectProjects unit

faults: ## The whole fault-injection suite with FAULT_RUNS (default 50) randomized runs; writes docs/faults-report.md
	bash test/faults/run.sh

mutants: ## One broken build per invariant (test/faults/mutants/*.mutant), each must fail its named tests; writes docs/mutants-report.md
	bash test/faults/mutants.sh --report docs/mutants-report.md $(MUTANTS)

##@ Performance

bench: ## Benchmarks beside their reference points, measured in the same run (own servers, about 11 min); writes docs/benchmarks.md
	bash test/env/deps.sh system
	PATH="$$(bash test/env/node.sh):$$PATH"; export PATH; echo "[bench] node $$(node --version)"; \
		bash test/env/deps.sh node && node --import tsx bench/run.ts

##@ Local environment

env-up: ## Start PostgreSQL, Redis, Kafka and kube-apiserver into ENV_DIR (default /tmp/flashsale-env); prints how to connect
	bash test/env/env-up.sh $(ENV_DIR)

env-down: ## Stop the servers started by env-up and remove ENV_DIR
	bash test/env/env-down.sh $(ENV_DIR)

##@ Chart and images

HELM = $(shell bash -c '. test/env/lib.sh; echo $$FLASHSALE_CACHE/bin/helm-$$HELM_VERSION/helm')

chart-lint: ## helm lint --strict the chart with the default (plus connection settings), small and large values
	bash test/env/build-kube.sh helm >/dev/null
	for v in test/integration/chart/values-connection.yaml examples/values-small.yaml examples/values-large.yaml; do $(HELM) lint --strict charts/flashsale --kube-version 1.34.0 $${v:+-f $$v} || exit 1; done

chart-sync: ## Copy crds/ and config/rbac/role.yaml, tenant_role.yaml into the chart (after editing either; a test fails on drift)
	cp crds/flashsale.io_flashsaleactivities.yaml charts/flashsale/files/crds/
	cp config/rbac/role.yaml config/rbac/tenant_role.yaml charts/flashsale/files/rbac/

images: ## Build the runtime and operator images (needs a Docker engine; docs/images.md)
	docker build --target runtime -t flashsale-runtime:0.1.0 .
	docker build --target operator -t flashsale-operator:0.1.0 .

# Flash-sale platform: developer commands. `make` (or `make help`) lists them.
# Each target's `## text` is its help line; add new targets the same way.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENV_DIR ?= /tmp/flashsale-env

.PHONY: help demo setup build lint test test-unit faults env-up env-down

help: ## List the targets
	@echo "Usage: make TARGET"
	@awk 'BEGIN { FS = ":.*## " } /^##@ / { printf "\n%s\n", substr($$0, 5) } \
		/^[a-zA-Z0-9_.-]+:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

##@ Run

demo: ## A whole sale end to end on this machine: servers, operator, runtime, buyers, checked summary (docs/demo.md)
	bash scripts/demo.sh

##@ Setup and build

setup: ## Install system packages and npm deps, build/cache the servers (Kafka jars, etcd, kube-apiserver, kubectl, helm)
	bash test/env/deps.sh all

build: ## Compile TypeScript (tsc -p tsconfig.build.json) into dist/
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

##@ Local environment

env-up: ## Start PostgreSQL, Redis, Kafka and kube-apiserver into ENV_DIR (default /tmp/flashsale-env); prints how to connect
	bash test/env/env-up.sh $(ENV_DIR)

env-down: ## Stop the servers started by env-up and remove ENV_DIR
	bash test/env/env-down.sh $(ENV_DIR)

# openshell-go. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X github.com/openshell-go/openshell/internal/version.Version=$(VERSION)
BINARIES := openshell-gateway openshell-sandbox openshell
GOLANGCI_LINT_VERSION ?= v2.15.0

.PHONY: help generate build lint test test-k8s-node test-unit bench check check-generated check-tidy check-imports run stop clean

help: ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

generate: ## regenerate api/ from proto/ (needs protoc)
	./hack/generate.sh

build: ## build all binaries into bin/
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

run: build ## start the gateway with embedded defaults (SQLite + process sandboxes) and open a sandbox
	./hack/quickstart.sh

stop: ## stop the gateway started by make run
	@pidfile="$${XDG_STATE_HOME:-$$HOME/.local/state}/openshell/gateway.pid"; \
	if [ -f "$$pidfile" ] && kill "$$(cat "$$pidfile")" 2>/dev/null; then echo "openshell-gateway stopped"; else echo "openshell-gateway is not running"; fi; rm -f "$$pidfile"

lint: ## gofmt, go vet and golangci-lint
	@out="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^api/'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; \
	elif [ -x "$$($(GO) env GOPATH)/bin/golangci-lint" ]; then "$$($(GO) env GOPATH)/bin/golangci-lint" run ./...; \
	else echo "golangci-lint not installed: skipping (install: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION))"; fi

test: build ## run every test, starting the real components they need (PostgreSQL, kube-apiserver, ...)
	./test/run-all.sh

test-k8s-node: build ## only the one-node Kubernetes suites (kubelet + containerd, needs root; also in make test)
	./test/k8s/node/run.sh

test-unit: ## run the Go tests without starting external components
	$(GO) test ./...

bench: build ## run benchmarks (ratios against same-run baselines)
	./test/bench.sh

check-generated: ## regenerate api/ and fail on any diff
	./hack/generate.sh
	@git diff --exit-code -- api/ || { echo "api/ is stale: run make generate"; exit 1; }
	@test -z "$$(git status --porcelain -- api/)" || { echo "api/ has untracked generated files"; git status --porcelain -- api/; exit 1; }

check-tidy: ## fail when go.mod/go.sum are not tidy
	$(GO) mod tidy
	@git diff --exit-code -- go.mod go.sum || { echo "go.mod/go.sum not tidy: run go mod tidy"; exit 1; }

check-imports: ## import rules (hack/check-imports.sh): api/ isolated, drivers, test helpers, server, API domains
	./hack/check-imports.sh

check: lint check-generated check-tidy check-imports ## every static check

clean: ## remove build output
	rm -rf bin

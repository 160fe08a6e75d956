# Ephemera — build, run and test. `make run` and `make test` are the two entry
# points (see README.md); everything else is a building block.

SHELL       := /bin/bash
GO          ?= go
OUT         ?= _output
BIN         := $(OUT)/bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit, also when the Go toolchain stamps none (-buildvcs=false, or a tree without .git):
# `ephemera-scratch version` prefers the toolchain's vcs.revision.
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS     := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# grpcnotrace: gRPC without golang.org/x/net/trace (grpc.EnableTracing, unused here). That
# package's html/template makes the linker keep every exported method of every linked type:
# 9.5 MB of the scratch binary (docs/operations.md, "Binary size").
# The shipped (image) binaries carry no symbol table or DWARF (-s -w): 30 -> 20 MB. Panics and
# profiles still name functions and lines (pclntab stays); only debuggers and core dumps lose.
SHIP_LDFLAGS := -s -w $(LDFLAGS)
GOTESTFLAGS ?=
# GOTAGS: build tags of every build, vet and test of the module (comma-separated).
# One variable so that all steps, the images and the tests' own
# `go build`s (exported as EPHEMERA_GOTAGS) compile with the same tags: the same flags
# are what make the Go build cache hit.
GOTAGS      ?= grpcnotrace
comma       := ,
taglist      = $(subst $(eval) ,$(comma),$(strip $(subst $(comma), ,$(GOTAGS) $(1))))
tags         = $(if $(taglist),-tags '$(taglist)')
GOBUILDFLAGS = $(call tags)
# The images' flags (build-static, build-windows: CGO_ENABLED=0, -trimpath). Every step
# but the -race tests builds with them too (vet, lint, the model test, e2e and its
# harness's builds, the cross-compiles and vets), so that each platform's package
# graph is compiled once in a cold run: Linux static, Linux -race, Windows.
# (No package of the module uses cgo; -race needs it.)
STATICFLAGS  = -trimpath $(GOBUILDFLAGS)
GOSTATIC     = CGO_ENABLED=0 $(GO)
# The same for the linters, which load packages through `go list -export`.
LINTENV      = CGO_ENABLED=0 GOFLAGS="$$($(GO) env GOFLAGS) -trimpath$(if $(taglist), -tags=$(taglist))"
export EPHEMERA_GOTAGS := $(GOTAGS)
PKGS        := ./...
EXAMPLES    := examples/hello examples/tokenfile examples/plugin-node
# The example plugin in JavaScript: its npm dependencies (package-lock.json) go into its node_modules.
NODE_EXAMPLE := examples/plugin-node
NPM          ?= npm

.PHONY: all build run test deps proto proto-check verify-e2e-modules lint test-unit test-model test-security test-flakes test-root test-crash test-sanity test-examples e2e soak soak-short \
        vet cross fmt verify bench bench-memory bench-fleet bench-fleet-smoke clean manifests chart-readme build-static build-static-arm64 build-windows image image-push image-pins image-check

all: build

## build: the scratch driver, its kubectl plugin and the walkthrough into _output/bin
build:
	$(GO) build $(GOBUILDFLAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/ephemera-scratch ./drivers/scratch
	$(GO) build $(GOBUILDFLAGS) -o $(BIN)/kubectl-ephemera ./drivers/scratch/cmd/kubectl-ephemera
	$(GO) build $(GOBUILDFLAGS) -o $(BIN)/walkthrough ./test/walkthrough

## run: start the scratch driver on embedded defaults and walk a fake pod through publish/unpublish (root)
run: build
	@rm -rf $(OUT)/state $(OUT)/kubelet $(OUT)/run
	$(BIN)/walkthrough --driver $(BIN)/ephemera-scratch --work $(OUT)

## test: everything CI runs (static checks, unit + root tests with -race, crash, sanity, examples,
## manifests, the image index built twice and checked, e2e, the fleet smoke test). Each step prints its wall and CPU time (.ci/step), and
## the list is repeated at the end (and kept in _output/test-times.txt). The Kubernetes binaries
## for e2e build in the background from the start, at the lowest CPU and I/O priority, so they
## take only what the steps leave idle; e2e raises the build to normal priority and waits for it
## (build-k8s.sh's lock). The steps of TEST_BESIDE_E2E only compile and analyse: they run beside
## e2e, which mostly waits on the kubelet and containerd, at the lowest priority too (their output
## goes to _output/beside-e2e.log, printed when e2e ends); make test waits for both.
# bench-fleet-smoke and soak-short after e2e: they take the kube-apiserver and etcd (and the kubelet) that e2e
# waited for (build-k8s.sh's lock).
TEST_STEPS := deps verify vet test-unit test-model test-examples manifests build-static e2e bench-fleet-smoke soak-short
# image-beside first: the e2e's TestShippedImageMigration (run last, t.Parallel) waits for its index. (build-static
# runs as a step before, so that the e2e and image-beside find the driver binary built and do not both link it.)
TEST_BESIDE_E2E := image-beside lint cross image-check release-check
test:
	@test/e2e/build-k8s.sh --check
	@mkdir -p $(OUT); : >$(OUT)/test-times.txt; : >$(OUT)/beside-e2e.log; rm -f $(IMAGE_OUT).digest $(IMAGE_OUT).failed; \
	if [ -z "$${EPHEMERA_E2E_K8S_BIN:-}" ]; then \
	  echo "test: building the Kubernetes binaries in the background (log: $(OUT)/build-k8s.log)"; \
	  ( setsid nice -n 19 ionice -c 2 -n 7 test/e2e/build-k8s.sh >$(OUT)/build-k8s.log 2>&1 & echo $$! >$(OUT)/build-k8s.pid ); \
	fi; \
	if [ "$(CONTAINERD)" = 2 ] && [ -z "$${EPHEMERA_E2E_CONTAINERD_BIN:-}" ]; then \
	  echo "test: building containerd 2 beside them (log: $(OUT)/build-containerd.log)"; \
	  ( setsid nice -n 19 ionice -c 2 -n 7 test/e2e/build-containerd.sh >$(OUT)/build-containerd.log 2>&1 & echo $$! >$(OUT)/build-containerd.pid ); \
	  if [ -z "$${EPHEMERA_E2E_RUNC_BIN:-}" ]; then \
	    echo "test: building runc (user-namespace scenarios) beside them (log: $(OUT)/build-runc.log)"; \
	    ( setsid nice -n 19 ionice -c 2 -n 7 test/e2e/build-runc.sh >$(OUT)/build-runc.log 2>&1 & echo $$! >$(OUT)/build-runc.pid ); \
	  fi; \
	fi; \
	trap 'for b in k8s containerd runc; do [ -f $(OUT)/build-$$b.pid ] && kill -TERM -- -$$(cat $(OUT)/build-$$b.pid) 2>/dev/null; rm -f $(OUT)/build-$$b.pid; done' EXIT; \
	t0=$$(date +%s); rc=0; beside=; \
	for s in $(TEST_STEPS); do \
	  if [ "$$s" = e2e ] && [ -n "$(TEST_BESIDE_E2E)" ]; then \
	    echo "test: $(TEST_BESIDE_E2E) beside e2e (log: $(OUT)/beside-e2e.log)"; \
	    ( for b in $(TEST_BESIDE_E2E); do \
	        STEP_TIMES=$(OUT)/test-times.txt .ci/step $$b nice -n 19 $(MAKE) --no-print-directory $$b IMAGE_PREBUILT=1 || exit $$?; \
	      done ) >$(OUT)/beside-e2e.log 2>&1 & beside=$$!; \
	  fi; \
	  STEP_TIMES=$(OUT)/test-times.txt .ci/step $$s $(MAKE) --no-print-directory $$s E2E_IMAGE=beside || { rc=$$?; break; }; \
	done; \
	if [ -n "$$beside" ]; then \
	  wait $$beside || { brc=$$?; [ $$rc != 0 ] || rc=$$brc; }; \
	  echo "--- beside e2e: $(TEST_BESIDE_E2E)"; cat $(OUT)/beside-e2e.log; \
	fi; \
	echo "make test: $$(( $$(date +%s) - t0 ))s"; cat $(OUT)/test-times.txt; \
	grep -h -e '^build-k8s: built' -e '^build-containerd: built' -e '^build-runc: built' $(OUT)/build-k8s.log $(OUT)/build-containerd.log $(OUT)/build-runc.log 2>/dev/null | sed 's/^/background /'; exit $$rc

## deps: the Debian packages make test needs (containerd, runc, mkfs, losetup, protoc; root; a no-op when present)
deps:
	test/e2e/install-deps.sh

## test-unit: all Go tests of the module with -race (root tests run when root)
test-unit:
	$(GO) test -race -count=1 $(GOBUILDFLAGS) $(GOTESTFLAGS) $(PKGS)

## test-model: the seeded random walk over publish, unpublish, crashes, restarts, lost state and
## the GC, invariants checked after every step (root; EPHEMERA_MODEL_STEPS, EPHEMERA_MODEL_SEED);
## TestNoisyNeighbours, the bulkheads' property (issue 32), which measures latencies; and
## TestTenantActions, the tenant property (issue 44), which measures memory cgroups (root, cgroup v1;
## EPHEMERA_TENANT_SEED): without -race
test-model:
	$(GOSTATIC) test -trimpath $(call tags,failpoints) -count=1 -timeout 30m -run '^(TestModel|TestNoisyNeighbours|TestTenantActions)$$' -v ./test/security/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|(model|neighbours|tenant)_test.go' ; exit $${PIPESTATUS[0]}

## test-security: the safety guarantees of docs/security.md, with the model test (root)
test-security: test-model
	$(GO) test -race -count=1 $(GOBUILDFLAGS) -v ./test/security/

## test-flakes: the timing-sensitive packages 20 times under -race beside a busy loop on every
## core (root; not in make test; FLAKE_COUNT, FLAKE_RUN, FLAKE_PKGS, FLAKE_LOAD: test/flakes.sh)
test-flakes:
	@test/flakes.sh

## test-crash: kill -9 at every side-effect boundary (root)
test-crash:
	$(GO) test -race -count=1 $(GOBUILDFLAGS) -v ./test/crash/

## test-sanity: csi-sanity with the node-only skip list (root)
test-sanity:
	$(GOSTATIC) test -count=1 $(STATICFLAGS) -v ./test/sanity/

## test-examples: the example drivers' own modules (examples/plugin-node's test runs its plugin with node,
## after npm ci; EPHEMERA_REQUIRE_NODE makes a missing node or node_modules fail it instead of skipping)
test-examples: $(NODE_EXAMPLE)/node_modules/.package-lock.json
	@for d in $(EXAMPLES); do (cd $$d && $(GOSTATIC) vet $(STATICFLAGS) ./... && EPHEMERA_REQUIRE_NODE=1 $(GO) test -race -count=1 $(GOBUILDFLAGS) ./...) || exit 1; done

.PHONY: node-modules
## node-modules: the exact npm dependencies of examples/plugin-node (npm ci, again only when package-lock.json
## changes: npm ci writes node_modules/.package-lock.json; no install scripts run; the lock's integrity hashes
## make the npm cache (~/.npm) safe to prefer)
node-modules: $(NODE_EXAMPLE)/node_modules/.package-lock.json
$(NODE_EXAMPLE)/node_modules/.package-lock.json: $(NODE_EXAMPLE)/package-lock.json $(NODE_EXAMPLE)/package.json
	cd $(NODE_EXAMPLE) && $(NPM) ci --prefer-offline --ignore-scripts --no-audit --no-fund
	@touch $@

# TestManyPods' rounds of 30 + 30 pods: one is the functional check and a sample; the latency
# figure of test/e2e/README.md pools three (make e2e E2E_MANYPODS_ROUNDS=3).
E2E_MANYPODS_ROUNDS ?= 1
# 1: TestFullNode also starts 110 emptyDir and 110 inline pods without faults first, for the
# time-to-all-Running ratio (about three minutes more).
E2E_FULLNODE_COMPARE ?=
# 1: TestGracefulNodeShutdown also runs its control, the same shutdown with the driver at priority 0
# (its volumes stay mounted; about 20 s more).
E2E_SHUTDOWN_CONTROL ?=

# K8S_VERSION: the Kubernetes release of e2e (and of make test's e2e step). The default is the one
# test/e2e/k8s/go.mod pins (v1.37.2); each other supported minor has test/e2e/k8s/v1.MINOR.mod (+ .sum), which
# pins one patch release (test/e2e/README.md, "Kubernetes versions"). build-k8s.sh refuses any other.
K8S_VERSION ?= $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2; exit }' test/e2e/k8s/go.mod)
export K8S_VERSION
# CONTAINERD: the containerd of e2e's containerd runtime: 2 (default), the release test/e2e/containerd/go.mod
# pins (v2.4.2), built from the Go module proxy by test/e2e/build-containerd.sh (cached, and in make test beside
# the Kubernetes build), or 1.6, Debian 12's package (install-deps.sh). runc is Debian's for both, but for the
# user-namespace scenarios' RuntimeClass on 2: runc >= 1.2 from the Go module proxy (test/e2e/build-runc.sh, cached).
CONTAINERD ?= 2

## e2e: real kubelet + kube-apiserver + etcd + containerd (root; builds Kubernetes $(K8S_VERSION) and containerd 2
## once, cached; make e2e K8S_VERSION=v1.35.4 for another supported release, CONTAINERD=1.6 for Debian's containerd),
## with the image's driver binary
## (build-static); the harness builds testbin and the registrar with the images' flags (STATICFLAGS).
# E2E_IMAGE: build (default) makes the image index (make image) before the e2e, which pushes it to its registry
# (TestShippedImageMigration); beside: make test builds it beside the e2e (image-beside) and the test waits for it.
E2E_IMAGE ?= build
e2e: build-static $(if $(filter beside,$(E2E_IMAGE)),,image)
	@test/e2e/build-k8s.sh --check
	test/e2e/install-deps.sh
	@for b in k8s containerd runc; do if [ -f $(OUT)/build-$$b.pid ]; then pg=$$(cat $(OUT)/build-$$b.pid); \
	  renice -n 0 -g $$pg >/dev/null 2>&1; ionice -c 2 -n 4 -P $$pg >/dev/null 2>&1; fi; done; true
	@if [ -z "$${EPHEMERA_E2E_K8S_BIN:-}" ]; then .ci/step build-k8s bash -c 'test/e2e/build-k8s.sh >/dev/null'; fi
	@if [ "$(CONTAINERD)" = 2 ] && [ -z "$${EPHEMERA_E2E_CONTAINERD_BIN:-}" ]; then .ci/step build-containerd bash -c 'test/e2e/build-containerd.sh >/dev/null'; fi
	@if [ "$(CONTAINERD)" = 2 ] && [ -z "$${EPHEMERA_E2E_RUNC_BIN:-}" ]; then .ci/step build-runc bash -c 'test/e2e/build-runc.sh >/dev/null'; fi
	EPHEMERA_E2E_CONTAINERD=$(CONTAINERD) EPHEMERA_E2E_DRIVER_BIN=$(CURDIR)/$(BIN)/ephemera-scratch EPHEMERA_E2E_ARTIFACTS=$(OUT)/e2e-logs \
	  EPHEMERA_E2E_IMAGE_LAYOUT=$(CURDIR)/$(IMAGE_OUT) $(if $(filter beside,$(E2E_IMAGE)),EPHEMERA_E2E_IMAGE_WAIT=30m) \
	  EPHEMERA_E2E_MANYPODS_ROUNDS=$(E2E_MANYPODS_ROUNDS) EPHEMERA_E2E_FULLNODE_COMPARE=$(E2E_FULLNODE_COMPARE) EPHEMERA_E2E_SHUTDOWN_CONTROL=$(E2E_SHUTDOWN_CONTROL) $(GOSTATIC) test -trimpath $(call tags,e2e) -count=1 -v -timeout 60m ./test/e2e/...

## soak: TestSoak alone on the e2e cluster (root): workloads churning through Deployments, Jobs and a
## DaemonSet with inline volumes of every backend beside an emptyDir control, a fault schedule derived
## from SOAK_SEED (default: the time; always printed), invariants checked every 3 s and at the end; the
## report per phase goes to $(OUT)/soak-report.md (test/e2e/README.md, "The soak"). SOAK=30m by default.
SOAK      ?= 30m
SOAK_SEED ?=
# SOAK_FAULTS: only these fault kinds (comma-separated names of the report's table), whatever the length.
SOAK_FAULTS ?=
# SOAK_TIMEOUT: go test's -timeout: the soak, the bring-up, the teardown of the workloads and the end checks.
SOAK_TIMEOUT ?= 60m
soak: build-static
	@test/e2e/build-k8s.sh --check
	test/e2e/install-deps.sh
	@if [ -z "$${EPHEMERA_E2E_K8S_BIN:-}" ]; then .ci/step build-k8s bash -c 'test/e2e/build-k8s.sh >/dev/null'; fi
	@if [ "$(CONTAINERD)" = 2 ] && [ -z "$${EPHEMERA_E2E_CONTAINERD_BIN:-}" ]; then .ci/step build-containerd bash -c 'test/e2e/build-containerd.sh >/dev/null'; fi
	@if [ "$(CONTAINERD)" = 2 ] && [ -z "$${EPHEMERA_E2E_RUNC_BIN:-}" ]; then .ci/step build-runc bash -c 'test/e2e/build-runc.sh >/dev/null'; fi
	EPHEMERA_SOAK=$(SOAK) EPHEMERA_SOAK_SEED=$(SOAK_SEED) EPHEMERA_SOAK_FAULTS=$(SOAK_FAULTS) EPHEMERA_SOAK_REPORT=$(CURDIR)/$(OUT)/soak-report.md \
	  EPHEMERA_E2E_CONTAINERD=$(CONTAINERD) EPHEMERA_E2E_DRIVER_BIN=$(CURDIR)/$(BIN)/ephemera-scratch EPHEMERA_E2E_ARTIFACTS=$(OUT)/e2e-logs \
	  $(GOSTATIC) test -trimpath $(call tags,e2e) -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' ./test/e2e/

## soak-short: the soak for 3 minutes (make test's step after e2e; about 4 min with the bring-up): the fast fault kinds once
## each (driver SIGKILL and restart, kubelet, containerd and API server restart, plugin crash and flap); plugin hang, state
## dir full, node reboot, graceful node shutdown, driver rollback and upgrade and the 2-minute API server outage run in
## soaks of 10 minutes or more (SOAK=30m: every kind at least 5 times)
soak-short:
	@$(MAKE) --no-print-directory soak SOAK=3m SOAK_TIMEOUT=20m

# Linters, pinned; built into $(OUT)/tools on first use.
TOOLS          := $(CURDIR)/$(OUT)/tools
STATICCHECK    := honnef.co/go/tools/cmd/staticcheck@v0.8.2
LOGCHECK       := sigs.k8s.io/logtools/logcheck@v0.11.0
GOIMPORTS      := golang.org/x/tools/cmd/goimports@v0.50.0
LOCAL_PREFIX   := github.com/ephemera-csi/ephemera

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install $(STATICCHECK)
$(TOOLS)/logcheck:
	GOBIN=$(TOOLS) $(GO) install $(LOGCHECK)
$(TOOLS)/goimports:
	GOBIN=$(TOOLS) $(GO) install $(GOIMPORTS)

# Protocol buffers: protoc from Debian (protobuf-compiler, 3.21.12 on bookworm: its version is in the
# generated files' header), protoc-gen-go at go.mod's google.golang.org/protobuf, protoc-gen-go-grpc pinned.
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
PROTOS             := api/plugin/v1alpha1/plugin.proto
$(TOOLS)/protoc-gen-go: go.mod
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go
$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO_GRPC)

## proto: regenerate the Go code of the plugin protocol (api/plugin/*/plugin.proto; needs protoc,
## apt-get install protobuf-compiler); make verify fails when the checked-in code is not current
proto: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	$(call protoc,.)

# protoc writes the generated code for $(PROTOS) below $(1).
protoc = protoc --plugin=protoc-gen-go=$(TOOLS)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(TOOLS)/protoc-gen-go-grpc \
	  --go_out=paths=source_relative:$(1) --go-grpc_out=paths=source_relative:$(1) $(PROTOS)

## proto-check: the checked-in generated code is what make proto writes (doc.go, the package doc, is not generated)
proto-check: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; $(call protoc,$$tmp) && \
	  for p in $(PROTOS); do d=$$(dirname $$p); \
	    if ! diff -r -x '*.proto' -x '*.md' -x doc.go $$tmp/$$d $$d; then echo "$$d: generated code not current (make proto)"; exit 1; fi; done

## lint: staticcheck, klog's logcheck (contextual, structured; the keys are checked to come from
## framework/internal/logkeys by its test), and import grouping (goimports -local)
lint: $(TOOLS)/staticcheck $(TOOLS)/logcheck $(TOOLS)/goimports
	$(LINTENV) $(TOOLS)/staticcheck $(PKGS)
	$(LINTENV) $(TOOLS)/staticcheck $(call tags,e2e) ./test/e2e/...
	$(LINTENV) $(TOOLS)/staticcheck $(call tags,fleet) ./test/fleet/...
	$(LINTENV) $(TOOLS)/logcheck -check-contextual -check-key=false -check-parameters=false -config .ci/logcheck.conf $(PKGS)
	@out=$$($(TOOLS)/goimports -local $(LOCAL_PREFIX) -l $$(git ls-files '*.go' ':!:*.pb.go')); if [ -n "$$out" ]; then echo "imports not grouped (goimports -local $(LOCAL_PREFIX) -w):"; echo "$$out"; exit 1; fi

## vet: go vet for Linux (with the images' flags, see STATICFLAGS)
vet:
	$(GOSTATIC) vet $(STATICFLAGS) $(PKGS)

## cross: the module and the examples vet (test/e2e with its tag: Linux-only, its doc.go alone), and its tests compile, for Windows (with the images' flags:
## build-windows then finds the Windows graph compiled)
cross: cross-test-windows
	GOOS=windows $(GOSTATIC) vet $(STATICFLAGS) $(PKGS)
	GOOS=windows $(GOSTATIC) vet -trimpath $(call tags,e2e) ./test/e2e/
	GOOS=windows $(GOSTATIC) build $(STATICFLAGS) -o /dev/null ./drivers/scratch
	@for d in $(EXAMPLES); do echo "GOOS=windows go vet ($$d)"; (cd $$d && GOOS=windows $(GOSTATIC) vet $(STATICFLAGS) ./...) || exit 1; done

## verify: gofmt clean, go.mod tidy, every module file of test/e2e/k8s and test/e2e/containerd verified (go mod verify), no tracked
## file over 1 MiB and every main package's go build output ignored (.ci/check-tree)
verify: proto-check verify-e2e-modules
	.ci/check-tree
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@cp go.mod /tmp/go.mod.bak; cp go.sum /tmp/go.sum.bak; $(GO) mod tidy; \
	  if ! diff -q go.mod /tmp/go.mod.bak >/dev/null || ! diff -q go.sum /tmp/go.sum.bak >/dev/null; then \
	    echo "go.mod/go.sum not tidy (run go mod tidy)"; cp /tmp/go.mod.bak go.mod; cp /tmp/go.sum.bak go.sum; exit 1; fi

## verify-e2e-modules: go mod verify for each Kubernetes module file of test/e2e/k8s (go.mod, v1.*.mod) and for
## test/e2e/containerd: the downloaded modules each pins are the ones its .sum names
verify-e2e-modules:
	@cd test/e2e/k8s && for m in go.mod v1.*.mod; do echo "go mod verify -modfile=$$m"; $(GO) mod verify -modfile=$$m || exit 1; done
	@cd test/e2e/containerd && echo "go mod verify (test/e2e/containerd)" && $(GO) mod verify
	@cd test/e2e/runc && echo "go mod verify (test/e2e/runc)" && $(GO) mod verify

## bench: the latency table against the raw-syscall floor, the kubelet-shaped comparison with a
## stateless reference driver (ratios; in process, and out of process with the image's binary and a
## syscall budget row from strace -c), the overhead of a plugin process over the same backend in process
## (issue 12), the scale rows (10,000 volumes) and the memory of the image's binary
## (the rows of issue 11 but the real kubelet's, which make e2e prints) and its peak under the worst
## content answers a plugin may give (root; a few minutes)
bench: build-static
	EPHEMERA_BENCH=1 EPHEMERA_BENCH_DRIVER_BIN=$(CURDIR)/$(BIN)/ephemera-scratch $(GO) test -count=1 $(GOBUILDFLAGS) -timeout 60m -run 'TestLatencyTable|TestKubeletShaped|TestKubeletShapedProcess|TestPluginOverhead|TestScale|TestDriverMemory|TestDriverContentMemory|TestDriverHeldMemory|TestFirstPublishAfterStart' -v ./test/bench/ 2>&1 | grep -v '^[IEW][0-9]'; exit $${PIPESTATUS[0]}

## bench-memory: RSS of the image's driver binary (build-static) as a subprocess, idle and with 1,000
## published tmpfs volumes, without and with the API server components, and its peak (VmHWM) under
## bursts of the worst content answers the plugin bounds allow, the whole memory plan in a memory cgroup
## limited like the DaemonSet's container (content held, answers in flight, walks, a restart), and its
## first calls after a start (root)
bench-memory: build-static
	EPHEMERA_BENCH=1 EPHEMERA_BENCH_DRIVER_BIN=$(CURDIR)/$(BIN)/ephemera-scratch $(GO) test -count=1 $(GOBUILDFLAGS) -run 'TestDriverMemory|TestDriverContentMemory|TestDriverHeldMemory|TestDriverPodMemory|TestFirstPublishAfterStart' -v ./test/bench/

## bench-fleet: the fleet simulation (test/fleet): a real kube-apiserver and etcd (the e2e's build) with
## priority and fairness and RBAC, EPHEMERA_FLEET_NODES simulated nodes (default 200) of
## EPHEMERA_FLEET_PODS pods (30) running the driver's API components (a token bound to the node's driver
## pod, a connection of their own: EPHEMERA_FLEET_CONNS=shared for one) beside kubelet-like watchers, pods
## written by the ReplicaSet controller's service account; phases of EPHEMERA_FLEET_PHASE (60s), an API
## server outage of EPHEMERA_FLEET_OUTAGE (2m); EPHEMERA_FLEET_STORMS=shipped for the steady phase and the
## shipped storms only (EPHEMERA_FLEET_WATCHERS_FIRST=1, EPHEMERA_FLEET_SLOWER=K; EPHEMERA_FLEET_APART=1: the
## control plane and the kube-system probe in a cgroup of 10x the simulation's CPU weight). About 10 minutes at 200
## nodes on 2 cores, 14 at 1,000, 30 at 2,000 (the API server then holds about 3 GB per 1,000 nodes); the report goes to
## _output/bench-fleet.md, or EPHEMERA_FLEET_REPORT (docs/operations.md, "At fleet scale")
bench-fleet:
	@mkdir -p $(OUT)
	EPHEMERA_FLEET=1 EPHEMERA_FLEET_NODES=$${EPHEMERA_FLEET_NODES:-200} EPHEMERA_FLEET_REPORT=$${EPHEMERA_FLEET_REPORT:-$(CURDIR)/$(OUT)/bench-fleet.md} \
	  $(GO) test -tags fleet -count=1 -timeout 60m -run '^TestFleet$$' -v ./test/fleet/ 2>&1 | grep -v '^[IEW][0-9]'; exit $${PIPESTATUS[0]}

## bench-fleet-smoke: the fleet simulation's smoke test (a step of make test, after e2e, whose build of
## kube-apiserver and etcd it takes): EPHEMERA_FLEET_NODES (default 20) nodes of 30 pods whose drivers all
## restart at once, failing unless the restart's counts are exactly O(node): one LIST per driver by the
## spec.nodeName index fetching its node's 30 pods and its own, no watch-list initial events, one CSIDriver read, no 429
## (about a minute with the API server's start); and TestGCMarks, the report's reading of the API server's
## GODEBUG=gctrace=1 collections against the kube-system probe's slow requests
bench-fleet-smoke:
	EPHEMERA_FLEET_SMOKE=1 EPHEMERA_FLEET_NODES=$${EPHEMERA_FLEET_NODES:-20} \
	  $(GO) test -tags fleet -count=1 -timeout 10m -run '^(TestFleetSmoke|TestGCMarks)$$' -v ./test/fleet/ 2>&1 | grep -v '^[IEW][0-9]'; exit $${PIPESTATUS[0]}

## manifests: test/manifests (own module): tidy check, invariant tests (the chart's README current among
## them), helm lint, and every deploy target (kustomize overlays, admission policy, helm template) rendered into _output/manifests
manifests:
	cd test/manifests && $(GO) mod tidy -diff && $(GOSTATIC) vet -trimpath ./... && $(GOSTATIC) test -trimpath -count=1 ./... && \
	  $(GOSTATIC) run -trimpath ./cmd/render -out $(CURDIR)/$(OUT)/manifests

## chart-readme: regenerate deploy/helm/ephemera-driver/README.md from the chart's values.yaml (every value
## and its comment), values.schema.json and Chart.yaml; make manifests fails when it is not current
chart-readme:
	cd test/manifests && $(GO) run ./cmd/chart-readme

# The image (deploy/images, its own module; docs/operations.md, "The image"): an OCI layout
# of linux/amd64, linux/arm64 and windows/amd64 (HostProcess) with an SBOM each, built without a
# container engine. Every timestamp is the commit's (SOURCE_DATE_EPOCH); the Debian packages of the
# Linux images are the ones deploy/images/debian.pins names, fetched once into IMAGE_CACHE.
IMAGE_OUT        ?= $(OUT)/image
IMAGE_CACHE      ?= $(if $(filter 0,$(shell id -u)),/var/cache/ephemera-image,$(HOME)/.cache/ephemera-image)
IMAGE_SOURCE     ?= https://github.com/ephemera-csi/ephemera
DEBIAN_MIRROR    ?= http://deb.debian.org/debian
DEBIAN_SECURITY_MIRROR ?= http://deb.debian.org/debian-security
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
# The scratch driver is one caller of deploy/images' build, the command authors run for their own
# driver (docs/authors.md, "The image"): it builds the driver for each platform itself and resolves
# the closure of IMAGE_PACKAGES from debian.pins (-offline: the committed pins hold it; make
# image-pins refreshes them). The image carries IMAGE_FILES of those packages and the libraries
# their programs load.
IMAGE_PACKAGES    = e2fsprogs,xfsprogs
IMAGE_FILES       = /sbin/mke2fs,/sbin/mkfs.ext4,/sbin/debugfs,/etc/mke2fs.conf,/sbin/mkfs.xfs
IMAGE_DESCRIPTION = Ephemera scratch driver: ephemeral inline CSI volumes (tmpfs, loop, dir; vhdx on Windows). Runs as root (Linux) or NT AUTHORITY\SYSTEM (Windows HostProcess): the node plugin mounts.
IMAGE_FLAGS       = -dir $(CURDIR) -main ./drivers/scratch -name ephemera-scratch -platforms linux/amd64,linux/arm64,windows/amd64 \
                    -packages $(IMAGE_PACKAGES) -files $(IMAGE_FILES) -tags '$(taglist)' -ldflags '$(SHIP_LDFLAGS)' -bin-out $(CURDIR)/$(BIN)/image \
                    -description '$(IMAGE_DESCRIPTION)' -licenses Apache-2.0 \
                    -pins debian.pins -offline -mirror $(DEBIAN_MIRROR) -security-mirror $(DEBIAN_SECURITY_MIRROR) -cache $(IMAGE_CACHE)/debs \
                    -version $(VERSION) -revision $(COMMIT) -source $(IMAGE_SOURCE) -source-date-epoch $(SOURCE_DATE_EPOCH)

## build-static: the scratch driver as a static, stripped Linux binary (CGO_ENABLED=0) for the image
build-static:
	GOOS=linux $(GOSTATIC) build $(STATICFLAGS) -ldflags "$(SHIP_LDFLAGS)" -o $(BIN)/ephemera-scratch ./drivers/scratch

## build-windows: the scratch driver for Windows (HostProcess image) as _output/bin/ephemera-scratch.exe, and
## _output/bin/windows/ with the driver, the real-node test client and test/windows/run.ps1 (copy it to a node)
build-windows:
	GOOS=windows GOARCH=amd64 $(GOSTATIC) build $(STATICFLAGS) -ldflags "$(SHIP_LDFLAGS)" -o $(BIN)/ephemera-scratch.exe ./drivers/scratch
	@mkdir -p $(BIN)/windows
	cp $(BIN)/ephemera-scratch.exe $(BIN)/windows/ephemera-scratch.exe
	GOOS=windows GOARCH=amd64 $(GOSTATIC) build $(STATICFLAGS) -o $(BIN)/windows/ephemera-wintest.exe ./test/windows/client
	cp test/windows/run.ps1 $(BIN)/windows/run.ps1

# Packages with Windows-only files, whose tests must compile for Windows.
WINDOWS_TEST_PKGS := ./framework/ ./framework/mount/ ./framework/internal/unixsock/ ./drivers/vhdx/ ./drivers/scratch/ ./test/windows/client/

.PHONY: cross-darwin
## cross-darwin: go vet of the module for macOS, where a driver author may run the rootless tests
## (fake mounter). Not in make test: Linux and Windows are the platforms the driver runs on, and
## the macOS package graph cost 290 s (560 s of CPU) of a cold run.
cross-darwin:
	GOOS=darwin $(GOSTATIC) vet $(STATICFLAGS) $(PKGS)

.PHONY: cross-test-windows
## cross-test-windows: GOOS=windows go test -c of every package with Windows files (nothing runs: no Windows here)
cross-test-windows:
	@for p in $(WINDOWS_TEST_PKGS); do echo "GOOS=windows go test -c $$p"; \
	  GOOS=windows GOARCH=amd64 $(GOSTATIC) test -c $(STATICFLAGS) -o /dev/null $$p || exit 1; done

## build-static-arm64: the same for linux/arm64 (_output/bin/linux-arm64/ephemera-scratch; cross-compiled, CGO_ENABLED=0)
build-static-arm64:
	GOOS=linux GOARCH=arm64 $(GOSTATIC) build $(STATICFLAGS) -ldflags "$(SHIP_LDFLAGS)" -o $(BIN)/linux-arm64/ephemera-scratch ./drivers/scratch

## image: the image index of the scratch driver as an OCI layout in _output/image (linux/amd64, linux/arm64,
## windows/amd64 HostProcess; a CycloneDX SBOM per platform in the index and in _output/image.sbom/), no container
## engine: deploy/images' build, the command driver authors run (docs/authors.md, "The image"), which builds the
## driver itself (binaries in _output/bin/image/) and resolves the Debian closure from debian.pins; prints the index
## digest (also in _output/image.digest). Push it with any OCI tool, e.g.
## `skopeo copy --all oci:_output/image:$(VERSION) docker://REGISTRY/ephemera-scratch:$(VERSION)`
image:
	@rm -f $(IMAGE_OUT).digest $(IMAGE_OUT).failed
	cd deploy/images && $(GOSTATIC) run -trimpath . build $(IMAGE_FLAGS) -out $(CURDIR)/$(IMAGE_OUT) -digest-file $(CURDIR)/$(IMAGE_OUT).digest

## image-push: push make image's index (all platforms and SBOMs) to IMAGE_REPO:$(VERSION), with the credentials of
## ~/.docker/config.json (no container engine; make image-push IMAGE_REPO=registry.example.com/ephemera-scratch)
image-push:
	@test -n "$(IMAGE_REPO)" || { echo "image-push: set IMAGE_REPO (e.g. registry.example.com/ephemera-scratch)"; exit 2; }
	cd deploy/images && $(GOSTATIC) run -trimpath . push -layout $(CURDIR)/$(IMAGE_OUT) -to $(IMAGE_REPO):$(VERSION)

## image-beside: make image as make test runs it beside the e2e: a failure leaves $(IMAGE_OUT).failed, so that
## the e2e test waiting for the index (EPHEMERA_E2E_IMAGE_WAIT) stops at once
.PHONY: image-beside
image-beside:
	@$(MAKE) --no-print-directory image || { touch $(IMAGE_OUT).failed; exit 1; }

## image-pins: refresh deploy/images/debian.pins to the newest bookworm packages of the closure of IMAGE_PACKAGES
## (run it when make image says a pinned .deb is gone from the mirror, then commit the file)
image-pins:
	cd deploy/images && $(GO) run . pins -pins debian.pins -packages $(IMAGE_PACKAGES) -mirror $(DEBIAN_MIRROR) -security-mirror $(DEBIAN_SECURITY_MIRROR)

## image-check: make image, then deploy/images' tests against it: every ELF's DT_NEEDED resolves inside its layer,
## the layers' drivers are the builds' (sha256), annotations, user and SBOMs, and a second build from the same inputs
## gives the same index digest; and every COPY source of the authors' template deploy/images/Dockerfile.driver and
## of examples/plugin-node/Dockerfile exists (no container engine needed)
image-check: export EPHEMERA_IMAGE_BUILD_FLAGS = $(IMAGE_FLAGS)
image-check: $(if $(IMAGE_PREBUILT),,image)
	cd deploy/images && $(GO) mod tidy -diff && $(GOSTATIC) vet ./... && EPHEMERA_IMAGE_LAYOUT=$(CURDIR)/$(IMAGE_OUT) \
	  $(GOSTATIC) test -trimpath -count=1 ./...
	deploy/images/check-copy-sources.sh deploy/images/Dockerfile.driver $(NODE_EXAMPLE)/Dockerfile

# A release (docs/operations.md, "Releases"): make image's index as an OCI layout archive, the chart packaged, the
# kustomize bundle naming the index by version and digest, the kubectl plugin for every platform with a krew
# manifest, the module as a file-based Go module proxy, notes, SHA256SUMS; in RELEASE_OUT, no container engine.
RELEASE_OUT        ?= $(OUT)/release
# Where the release's files will be downloadable: the krew manifest's URIs (krew/ephemera.yaml).
RELEASE_URL        ?= https://github.com/ephemera-csi/ephemera/releases/download/$(VERSION)
# The name of the index in the archive (containerd's, on ctr images import) and in the manifests and chart.
RELEASE_IMAGE_REPO ?= localhost/ephemera-scratch
RELEASE_PLATFORMS  ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64
RELEASE_PLUGINS     = $(foreach p,$(RELEASE_PLATFORMS),-plugin $(p)=$(CURDIR)/$(BIN)/plugins/$(subst /,-,$(p))/kubectl-ephemera$(if $(findstring windows,$(p)),.exe))

.PHONY: release release-plugins release-bundle release-check
## release: make release VERSION=vX.Y.Z [RELEASE_URL=...] [RELEASE_IMAGE_REPO=...]: the image index (make image) and
## everything above in _output/release, checked (every image of the manifests and the chart resolves inside the
## archive); refuses a version that is not vX.Y.Z and a tree with uncommitted changes (the module zip is the commit's)
release:
	@[[ "$(VERSION)" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$$ ]] || { echo "release: VERSION=$(VERSION): want vX.Y.Z (make release VERSION=v0.3.0)"; exit 2; }
	@git diff --quiet HEAD || { echo "release: uncommitted changes: the module zip is made of the commit, the binaries of the tree; commit first"; exit 2; }
	$(MAKE) --no-print-directory image VERSION=$(VERSION)
	$(MAKE) --no-print-directory release-plugins release-bundle VERSION=$(VERSION)

## release-plugins: kubectl-ephemera for each of RELEASE_PLATFORMS into _output/bin/plugins/OS-ARCH/
release-plugins:
	@for p in $(RELEASE_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; ext=; [ $$os = windows ] && ext=.exe; \
	  echo "kubectl-ephemera $$p"; GOOS=$$os GOARCH=$$arch $(GOSTATIC) build $(STATICFLAGS) -ldflags "$(SHIP_LDFLAGS)" \
	    -o $(BIN)/plugins/$$os-$$arch/kubectl-ephemera$$ext ./drivers/scratch/cmd/kubectl-ephemera || exit 1; done

## release-bundle: the release of make image's index and the plugins already built (test/manifests/cmd/release), checked
release-bundle:
	cd test/manifests && $(GOSTATIC) run ./cmd/release -version $(VERSION) -image-layout $(CURDIR)/$(IMAGE_OUT) \
	  -image-repo $(RELEASE_IMAGE_REPO) -release-url $(RELEASE_URL) -revision $(COMMIT) -source-date-epoch $(SOURCE_DATE_EPOCH) \
	  $(RELEASE_PLUGINS) -out $(CURDIR)/$(RELEASE_OUT)

## release-check: make test's reduced release: the index make image built (IMAGE_PREBUILT: already there), the plugin
## for linux/amd64 only, VERSION as it is (a pseudo-version for the module and the chart); the full matrix is make release's
release-check: $(if $(IMAGE_PREBUILT),,image)
	$(MAKE) --no-print-directory release-plugins release-bundle RELEASE_PLATFORMS=linux/amd64

clean:
	rm -rf $(OUT)

# Warden. `make run` builds everything and starts the whole system locally;
# `make test` runs every test. Nothing but Go is needed (and Docker for
# `make images`).

SHELL   := /bin/bash
GO      ?= go
BIN     ?= bin
CMDS    := scheduler supervisor agent warden
IMAGES  := $(CMDS) nats-server
TAG     ?= dev
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEMO    ?= examples/deploy.yaml

.PHONY: all build run test lint bench images chaos clean

all: build

# Static binaries (CGO_ENABLED=0) so that they run FROM scratch; the
# nats-server binary is built from the module version pinned in go.mod.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

# The whole system on an embedded NATS server (data in ./.warden): submits
# the demo job, follows it to the end, keeps running until Ctrl-C.
run: build
	$(BIN)/warden dev --demo $(DEMO)

# Must stay under 10 minutes on 2 cores.
test:
	$(GO) test -race -count=1 -timeout 9m ./...

lint:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Micro-benchmarks of the hot paths (briefly), then the system benchmark
# (cmd/bench: raw JetStream, throughput, latency, failover, scale, memory),
# which writes bench/results/<timestamp>.json and latest.json. Under 10
# minutes on 2 cores. `go run ./cmd/bench --quick` or `--only raw,scale`
# runs less.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=100ms ./pkg/spec ./pkg/selection ./pkg/jobstore
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=300x ./pkg/scheduler
	$(GO) run ./cmd/bench $(BENCHFLAGS)

# FROM scratch images of the static binaries (no base image can be pulled).
images: build
	@for b in $(IMAGES); do \
		echo "docker build warden/$$b:$(TAG)"; \
		docker build --build-arg BINARY=$$b -t warden/$$b:$(TAG) . || exit 1; \
	done

# The chaos suite in full: real processes, 240 jobs, kills, pauses and a
# nats-server restart, CHAOS_RUNS times with fresh seeds (each run prints its
# seed; replay one with CHAOS_SEED=N). `make test` runs a short seeded form.
CHAOS_RUNS ?= 3
CHAOS_SEED ?=
chaos:
	@set -e; for i in $$(seq $(CHAOS_RUNS)); do \
		seed=$${CHAOS_SEED:-$$(( ($$(date +%s%N) / 1000) % 1000000 + i ))}; \
		echo "== chaos run $$i of $(CHAOS_RUNS), seed $$seed"; \
		$(GO) test -count=1 -timeout 9m -run '^TestChaos$$' -v ./test/chaos -chaos.full -chaos.seed=$$seed \
			| grep -E '^(---|ok|FAIL|PASS)|chaos_test.go'; \
		test $${PIPESTATUS[0]} -eq 0; \
	done

clean:
	rm -rf $(BIN) .warden

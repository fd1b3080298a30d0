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

.PHONY: all build run test lint bench images chaos clean creds certs compose-up compose-down compose-test

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
# (cmd/bench: raw JetStream, throughput, latency, dag, delayed,
# concurrency, history, failover, cluster, scale, memory), which writes
# bench/results/<timestamp>.{json,md} and latest.json. Under 10 minutes on 2 cores. `go run ./cmd/bench --quick`
# or `--only raw,scale` runs less; BENCHFLAGS="--before
# bench/results/before-rewrite.json --profile-dir bench/results/prof" adds
# a before column and pprof of nats-server and Warden.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=100ms ./pkg/spec ./internal/selection ./internal/jobstore
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=300x ./internal/scheduler
	$(GO) run ./cmd/bench $(BENCHFLAGS)

# FROM scratch images of the static binaries (no base image can be pulled).
# bin/.empty becomes the images' /data, owned by the runtime user 65532.
images: build
	@mkdir -p $(BIN)/.empty
	@for b in $(IMAGES); do \
		echo "docker build warden/$$b:$(TAG)"; \
		docker build --build-arg BINARY=$$b -t warden/$$b:$(TAG) . || exit 1; \
	done

# The chaos suite in full, CHAOS_RUNS times with fresh seeds (each run prints
# its seed; replay one with CHAOS_SEED=N): real processes, 240 jobs, kills,
# pauses and a nats-server restart; then three nats-server restarts under
# load with 20 agents, a cancel while the agents are SIGSTOPped, and a
# deposed supervisor leader. `make test` runs a short seeded form of the first.
CHAOS_RUNS ?= 3
CHAOS_SEED ?=
chaos:
	@set -e; for i in $$(seq $(CHAOS_RUNS)); do \
		seed=$${CHAOS_SEED:-$$(( ($$(date +%s%N) / 1000) % 1000000 + i ))}; \
		echo "== chaos run $$i of $(CHAOS_RUNS), seed $$seed"; \
		$(GO) test -count=1 -timeout 9m -v ./test/chaos -chaos.full -chaos.seed=$$seed \
			-run '^(TestChaos|TestNATSRestartsUnderLoadFailOverNobody|TestCancelWhileAgentsAreStopped|TestDeposedLeaderDuplicatesNothing)$$' \
			| grep -E '^(---|ok|FAIL|PASS)|(chaos|natsrestart|cancel|deposed)_test.go'; \
		test $${PIPESTATUS[0]} -eq 0; \
	done

# Not .warden/secrets: `make creds` keeps the deployment's keys there.
clean:
	rm -rf $(BIN) .warden/config .warden/jetstream

# Credentials for docker-compose.yml (docs/security.md): operator, accounts,
# one NATS identity per role and per agent, the server config, and a CA and
# server certificate made with Go's crypto (no openssl). TLS=0 leaves TLS
# off (routes then authenticate with a generated password). Keys stay in
# $(SECRETS)/keys; the containers (uid 65532) get only server/ and creds/.
SECRETS ?= .warden/secrets
TLS     ?= 1
AGENTS  ?= default.agent-1,default.agent-2,default.agent-3
COMPOSE ?= docker-compose
creds: build
	$(BIN)/warden creds init --dir $(SECRETS) $(if $(filter 1,$(TLS)),--tls) --task-shards 4 \
		--routes nats-1:6222,nats-2:6222,nats-3:6222 --agents $(AGENTS) --server-dir /etc/warden/secrets/server
	@if [ "$$(id -u)" = 0 ]; then chown -R 65532:65532 $(SECRETS)/server $(SECRETS)/creds; \
	else echo "note: the containers run as uid 65532 and need to read $(SECRETS)/server and $(SECRETS)/creds:"; \
		echo "      sudo chown -R 65532:65532 $(SECRETS)/server $(SECRETS)/creds"; fi

# The TLS CA and server certificate are made by `creds` (one directory).
certs: creds

# TLS or not, from the manifest `creds` wrote.
COMPOSE_ENV = WARDEN_SECRETS=$(SECRETS) $$(if grep -q '"tls": true' $(SECRETS)/manifest.json; \
	then echo WARDEN_NATS_SCHEME=tls; else echo WARDEN_NATS_SCHEME=nats WARDEN_NATS_CA=; fi)

# The deployment: NATS first, then `warden setup` (the only identity that
# may create streams; retried while the cluster elects its meta leader),
# then everything else.
compose-up:
	@test -f $(SECRETS)/manifest.json || { echo "no credentials in $(SECRETS): run make images creds first"; exit 1; }
	env $(COMPOSE_ENV) $(COMPOSE) up -d nats-1 nats-2 nats-3
	@for i in $$(seq 30); do env $(COMPOSE_ENV) $(COMPOSE) run --rm setup && exit 0; sleep 2; done; exit 1
	env $(COMPOSE_ENV) $(COMPOSE) up -d

compose-down:
	env $(COMPOSE_ENV) $(COMPOSE) down -v

# The production shape end to end (test/compose): generated credentials and
# TLS, jobs through it, 0 permission errors in any log, no nothing_to_move
# failovers over COMPOSE_HEALTHY of healthy running, agents ls under 1 s,
# a server without route credentials cannot join, nothing runs as root.
# Skips with a message where Docker is absent. Uses ports 4222, 9090-9093.
COMPOSE_HEALTHY ?= 2m
compose-test:
	@if ! command -v docker >/dev/null 2>&1 || ! command -v $(COMPOSE) >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
		echo "compose-test: SKIPPED: docker and $(COMPOSE) are needed (and a running Docker daemon)"; exit 0; fi; \
	$(MAKE) images creds && \
	WARDEN_COMPOSE_TEST=1 WARDEN_SECRETS=$(SECRETS) COMPOSE_HEALTHY=$(COMPOSE_HEALTHY) \
		$(GO) test -count=1 -timeout 20m -v -run TestCompose ./test/compose

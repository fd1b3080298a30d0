#!/bin/sh
# A runnable tour of agent clusters (docs/clusters.md) on `warden dev`.
# Builds the binaries, starts Warden locally, defines an active-passive
# cluster, starts three member agents, kills the leader with -9 and shows
# the failover. Everything stops when the script ends.
set -eu
cd "$(dirname "$0")/.."
BIN=$(mktemp -d)
go build -o "$BIN/" ./cmd/warden ./cmd/agent ./cmd/scheduler ./cmd/supervisor
export PATH="$BIN:$PATH" NATS_URL=nats://127.0.0.1:4222
DATA=$(mktemp -d)
warden dev --data "$DATA" --agents 1 >"$DATA/dev.log" 2>&1 &
DEV=$!
# Under set -e a failing kill (the leader is already gone after its kill
# -9) ended the clean-up there and left warden dev and its data running.
A1= A2= A3=
trap 'kill $A1 $A2 $A3 2>/dev/null || true; kill $DEV 2>/dev/null || true; wait; rm -rf "$BIN" "$DATA"' EXIT
until warden cluster ls >/dev/null 2>&1; do sleep 0.2; done

warden cluster create -f examples/cluster-prod-docker.yaml
agent --config examples/cluster-agent.yaml --id docker-a >"$DATA/a.log" 2>&1 & A1=$!
agent --config examples/cluster-agent.yaml --id docker-b >"$DATA/b.log" 2>&1 & A2=$!
agent --config examples/cluster-agent.yaml --id docker-c >"$DATA/c.log" 2>&1 & A3=$!
sleep 4
warden cluster show prod-docker

LEADER=$(warden --json cluster show prod-docker | sed -n 's/.*"leader": "docker\.\([^"]*\)".*/\1/p' | head -1)
echo "--- kill -9 the leader docker.$LEADER"
case $LEADER in docker-a) kill -9 $A1 ;; docker-b) kill -9 $A2 ;; docker-c) kill -9 $A3 ;; esac
sleep 5
warden cluster show prod-docker
warden failovers ls --cluster prod-docker

echo "--- hand leadership back by hand"
warden cluster failover prod-docker --reason demo
sleep 1
warden failovers ls --cluster prod-docker

#!/usr/bin/env bash
# Starts a fresh ursula server on a free port and runs the official Durable Streams
# conformance suite (@durable-streams/server-conformance-tests, pinned in package-lock.json)
# against its /v1/stream/ compatibility family.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
log=$data/server.log
"$root/bin/ursula" server --listen "127.0.0.1:$port" --data "$data" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/__ursula/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
cd test/conformance
CONFORMANCE_TEST_URL="http://127.0.0.1:$port" npx vitest run "$@"

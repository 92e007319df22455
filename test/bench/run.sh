#!/usr/bin/env bash
# Side-by-side load benchmark: our ursula server against the Durable Streams reference
# server (@durable-streams/server, Node, pinned in test/conformance/package-lock.json).
#
# Builds bin/ursula and bin/ursula-bench, starts both servers on free loopback ports, runs
# the same scenarios against each in turn (append latency/throughput with 1, 16 and 64
# writers; SSE delivery latency to 100 live readers), then prints the comparison table
# (absolute numbers and the ratio ursula/reference). Both servers are stopped on exit.
#
# Usage (from anywhere):  test/bench/run.sh [ursula-bench flags, e.g. --duration 10s]
# Environment:
#   BENCH_OUT    directory for the JSON results (default test/bench/results/<timestamp>)
#   URSULA_ARGS  extra flags for `ursula server` (e.g. "--engine memory")
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
go build -o "$root/bin/ursula" ./cmd/ursula
go build -o "$root/bin/ursula-bench" ./cmd/ursula-bench
if [ ! -d test/conformance/node_modules/@durable-streams/server ]; then
  echo "== installing the reference server (npm ci in test/conformance)"
  (cd test/conformance && npm ci --no-audit --no-fund)
fi

out=${BENCH_OUT:-$root/test/bench/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
ports=$("$root/bin/ursula-bench" freeport 2)
uport=$(echo "$ports" | sed -n 1p)
rport=$(echo "$ports" | sed -n 2p)

echo "== starting ursula on 127.0.0.1:$uport and the reference server on 127.0.0.1:$rport"
# shellcheck disable=SC2086
"$root/bin/ursula" server --listen "127.0.0.1:$uport" --data "$work/ursula-data" ${URSULA_ARGS:-} \
  >"$out/ursula-server.log" 2>&1 &
pids+=($!)
(cd test/conformance && exec node reference-server.mjs "$rport") >"$out/reference-server.log" 2>&1 &
pids+=($!)
"$root/bin/ursula-bench" wait "http://127.0.0.1:$uport/__ursula/ready"
"$root/bin/ursula-bench" wait "http://127.0.0.1:$rport/v1/stream/"

# The load generator runs in the background and is waited for, so that a signal to this
# script is handled at once (the trap stops the generator and both servers).
bench() {
  "$root/bin/ursula-bench" "$@" &
  local pid=$!
  pids+=("$pid")
  wait "$pid"
}

echo "== ursula ($(nproc 2>/dev/null || echo ?) CPUs, shared with the load generator)"
bench --url "http://127.0.0.1:$uport/bench" --label ursula --out "$out/ursula.json" "$@"
echo "== reference"
bench --url "http://127.0.0.1:$rport/v1/stream" --label reference --out "$out/reference.json" "$@"

echo "== comparison"
"$root/bin/ursula-bench" compare "$out/ursula.json" "$out/reference.json" | tee "$out/compare.txt"
echo "results in $out"

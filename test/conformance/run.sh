#!/usr/bin/env bash
# Runs the official Durable Streams conformance suite (@durable-streams/server-conformance-tests,
# pinned in package-lock.json) against the /v1/stream/ compatibility family of fresh servers,
# once per engine mode:
#   memory  one node, memory engine
#   raft    one node, raft engine (single voter, node log on disk)
#   raft3   a 3-node loopback cluster; every group's leadership is moved to node 1 and the
#           suite talks to node 1 (followers serve catch-up reads from their own replica,
#           which may trail the leader by a commit round, so read-your-write suites need
#           the leader)
# Usage: test/conformance/run.sh [vitest args]; CONFORMANCE_MODES="memory raft raft3" picks modes.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
modes=${CONFORMANCE_MODES:-memory raft raft3}
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
dirs=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Cluster nodes are not our children (cluster.sh started them): wait for their exit.
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  for d in "${dirs[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT
waitready() {
  for _ in $(seq 1 100); do
    curl -fsS "$1/__ursula/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server at $1 not ready" >&2
  return 1
}
summary=()
for mode in $modes; do
  data=$(mktemp -d)
  dirs+=("$data")
  case $mode in
    memory|raft)
      port=$(freeport)
      url="http://127.0.0.1:$port"
      "$root/bin/ursula" server --engine "$mode" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" >"$data/server.log" 2>&1 &
      pids+=($!)
      waitready "$url"
      ;;
    raft3)
      # Six fixed offsets from a random base; another process may hold one: retry elsewhere.
      for attempt in 1 2 3 4 5; do
        base=$(( ( $(freeport) % 20000 ) + 30000 ))
        cdir="$data/attempt$attempt" # fresh: a node's raft state remembers its peers' addresses
        URSULA_CLUSTER_BASE_PORT=$base URSULA_BIN="$root/bin/ursula" test/cluster/cluster.sh --background "$cdir" >/dev/null 2>"$data/cluster.err" && break
        [ $attempt = 5 ] && { cat "$data/cluster.err" >&2; exit 1; }
      done
      read -r -a cpids <"$cdir/pids"
      pids+=("${cpids[@]}")
      url="http://127.0.0.1:$((base + 1))"
      test/cluster/lead.sh 1 "http://127.0.0.1:$((base + 21))" "http://127.0.0.1:$((base + 22))" "http://127.0.0.1:$((base + 23))"
      ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  echo "== conformance: $mode ($url)"
  set +e
  (cd test/conformance && CONFORMANCE_TEST_URL="$url" npx vitest run "$@") 2>&1 | tee "$data/vitest.out"
  rc=${PIPESTATUS[0]}
  set -e
  summary+=("$mode: $(sed 's/\x1b\[[0-9;]*m//g' "$data/vitest.out" | grep -E '^ +Tests ' | tr -s ' ' | sed 's/^ //' || true)")
  if [ "$rc" != 0 ]; then
    printf '%s\n' "${summary[@]}"
    exit "$rc"
  fi
done
echo "== conformance summary"
printf '%s\n' "${summary[@]}"

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
#   gateway a raft node with auth on (token file) behind `ursula gateway` with auth on; the
#           suite talks to the gateway, its requests carrying a bearer token (auth-fetch.mjs,
#           CONFORMANCE_TOKEN) and the gateway presenting its own token to the node
# Usage: test/conformance/run.sh [vitest args]; CONFORMANCE_MODES="memory raft raft3" picks modes.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
modes=${CONFORMANCE_MODES:-memory raft raft3 gateway}
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
        # The balancer off: lead.sh puts every leadership on node 1, where the suite's
        # reads-after-writes go, and it must stay there for the run.
        URSULA_CLUSTER_RAFT='leader_balance_interval = "0"' URSULA_CLUSTER_BASE_PORT=$base URSULA_BIN="$root/bin/ursula" test/cluster/cluster.sh --background "$cdir" >/dev/null 2>"$data/cluster.err" && break
        [ $attempt = 5 ] && { cat "$data/cluster.err" >&2; exit 1; }
      done
      read -r -a cpids <"$cdir/pids"
      pids+=("${cpids[@]}")
      url="http://127.0.0.1:$((base + 1))"
      test/cluster/lead.sh 1 "http://127.0.0.1:$((base + 21))" "http://127.0.0.1:$((base + 22))" "http://127.0.0.1:$((base + 23))"
      ;;
    gateway)
      # Two credentials: the suite's (checked by the gateway) and the gateway's own (checked
      # by the node). Neither is valid at the other hop.
      client_tok=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
      gw_tok=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
      printf '%s *\n' "$client_tok" >"$data/gateway-tokens"
      printf '%s *,admin\n' "$gw_tok" >"$data/node-tokens"
      printf '%s\n' "$gw_tok" >"$data/upstream-token"
      printf '[auth]\ntoken_file = "%s"\n' "$data/node-tokens" >"$data/node.toml"
      printf '[gateway]\nupstream_token_file = "%s"\n[auth]\ntoken_file = "%s"\n' "$data/upstream-token" "$data/gateway-tokens" >"$data/gateway.toml"
      nport=$(freeport)
      "$root/bin/ursula" server --engine raft --config "$data/node.toml" --listen "127.0.0.1:$nport" --admin-listen 127.0.0.1:0 --data "$data" >"$data/server.log" 2>&1 &
      pids+=($!)
      waitready "http://127.0.0.1:$nport"
      # The node refuses the suite's token: proof that the gateway's own token is what works.
      code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $client_tok" "http://127.0.0.1:$nport/v1/stream/auth-probe")
      [ "$code" = 401 ] || { echo "node with auth on answered $code to a token it does not know" >&2; exit 1; }
      port=$(freeport)
      url="http://127.0.0.1:$port"
      "$root/bin/ursula" gateway --config "$data/gateway.toml" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$nport" >"$data/gateway.log" 2>&1 &
      pids+=($!)
      waitready "$url"
      code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/stream/auth-probe")
      [ "$code" = 401 ] || { echo "gateway with auth on answered $code without a token" >&2; exit 1; }
      export CONFORMANCE_TOKEN=$client_tok
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

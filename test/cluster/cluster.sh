#!/usr/bin/env bash
# Starts a 3-node ursula cluster on loopback (raft engine, 3 voters per group).
#
#   test/cluster/cluster.sh [--background] [DIR]
#
# DIR (default: a new temp dir) receives node<i>.toml, node<i>/ (data) and node<i>.log.
# Ports: HTTP 127.0.0.1:$BASE+i, cluster listener 127.0.0.1:$BASE+10+i (i = 1..3), with
# BASE from $URSULA_CLUSTER_BASE_PORT (default 24430). Extra [raft] settings come from
# $URSULA_CLUSTER_RAFT (TOML lines, e.g. 'wal.fsync = "always"'). With $URSULA_NODE_PROF
# set, node i writes a Go CPU profile to $URSULA_NODE_PROF.i until it stops.
# In the foreground it waits until Ctrl-C and stops the nodes; with --background it
# returns once every node is ready and writes the node pids to DIR/pids.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bg=0
if [ "${1:-}" = "--background" ]; then bg=1; shift; fi
dir=${1:-$(mktemp -d)}
mkdir -p "$dir"
base=${URSULA_CLUSTER_BASE_PORT:-24430}
bin=${URSULA_BIN:-$root/bin/ursula}
[ -x "$bin" ] || go build -o "$bin" ./cmd/ursula

peers=""
for i in 1 2 3; do
  peers+="[[raft.peers]]
node_id = $i
url = \"http://127.0.0.1:$((base + i))\"
raft_addr = \"127.0.0.1:$((base + 10 + i))\"
"
done
pids=()
for i in 1 2 3; do
  cat >"$dir/node$i.toml" <<TOML
[server]
listen = "127.0.0.1:$((base + i))"
admin_listen = "127.0.0.1:$((base + 20 + i))"
data_dir = "$dir/node$i"
cluster_id = "loopback-cluster"
engine = "raft"

[raft]
node_id = $i
group_count = ${URSULA_CLUSTER_GROUPS:-16}
init_membership_per_group = true
${URSULA_CLUSTER_RAFT:-}

$peers
TOML
  "$bin" server --config "$dir/node$i.toml" ${URSULA_NODE_PROF:+--cpuprofile $URSULA_NODE_PROF.$i} >"$dir/node$i.log" 2>&1 &
  pids+=($!)
done
echo "${pids[*]}" >"$dir/pids"
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
for i in 1 2 3; do
  ok=0
  for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$((base + i))/__ursula/ready" >/dev/null 2>&1; then ok=1; break; fi
    dead=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || dead=1; done
    [ $dead = 1 ] && break # a node exited (a port in use, a bad config)
    sleep 0.1
  done
  if [ $ok = 0 ]; then
    echo "node $i did not become ready; logs:" >&2
    for j in 1 2 3; do tail -3 "$dir/node$j.log" >&2; done
    stop
    exit 1
  fi
done
echo "cluster ready: http://127.0.0.1:$((base + 1)) http://127.0.0.1:$((base + 2)) http://127.0.0.1:$((base + 3)) (data and logs in $dir)"
if [ $bg = 1 ]; then exit 0; fi
trap 'stop; exit 0' INT TERM
echo "Ctrl-C stops the cluster. Status: curl http://127.0.0.1:$((base + 21))/__ursula/raft/status (admin listeners: ports $((base + 21))-$((base + 23)))"
wait

#!/usr/bin/env bash
# Moves the leadership of every group to one node: test/cluster/lead.sh URL_OF_TARGET NODE_ID
# (asks each group's current leader to transfer; used by the conformance run on 3 nodes so
# the suite's reads-after-writes all hit the leader).
set -euo pipefail
target=$1 id=$2
for _ in $(seq 1 100); do
  status=$(curl -fsS "$target/__ursula/raft/status")
  moves=$(python3 -c '
import json,sys
s=json.loads(sys.argv[1]); want=sys.argv[2]
for g in s["groups"]:
    if g["leader_id"]!=want and g["leader_url"]:
        print(g["leader_url"], g["group"])
' "$status" "$id")
  if [ -z "$moves" ]; then
    leading=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["leading"])' "$status")
    count=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["group_count"])' "$status")
    [ "$leading" = "$count" ] && exit 0
  fi
  while read -r url g; do
    [ -n "$url" ] && curl -fsS -X POST -H "X-Ursula-Admin: 1" "$url/__ursula/raft/transfer?group=$g&to=$id" >/dev/null 2>&1 || true
  done <<<"$moves"
  sleep 0.2
done
echo "could not move every leadership to node $id" >&2
exit 1

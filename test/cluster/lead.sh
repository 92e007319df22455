#!/usr/bin/env bash
# Moves the leadership of every group to one node:
#   test/cluster/lead.sh NODE_ID ADMIN_URL_OF_NODE_1 ADMIN_URL_OF_NODE_2 ...
# (admin listener URLs in node id order; each group's current leader is asked to transfer.
# Used by the conformance run on 3 nodes so the suite's reads-after-writes all hit the
# leader.)
set -euo pipefail
id=$1
shift
admins=("$@")
target=${admins[$((id - 1))]}
for _ in $(seq 1 100); do
  status=$(curl -fsS "$target/__ursula/raft/status")
  moves=$(python3 -c '
import json,sys
s=json.loads(sys.argv[1]); want=sys.argv[2]
for g in s["groups"]:
    if g["leader_id"]!=want and g["leader_id"]:
        print(g["leader_id"], g["group"])
' "$status" "$id")
  if [ -z "$moves" ]; then
    leading=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["leading"])' "$status")
    count=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["group_count"])' "$status")
    [ "$leading" = "$count" ] && exit 0
  fi
  while read -r leader g; do
    [ -n "$leader" ] || continue
    admin=${admins[$((leader - 1))]}
    # Admin mutations are pinned to the process the node runs now (428 without).
    inc=$(curl -fsS "$admin/__ursula/metrics" | python3 -c 'import json,sys; print(json.load(sys.stdin)["process_incarnation"])') || continue
    curl -fsS -X POST -H "X-Ursula-Admin: 1" -H "X-Ursula-Process-Incarnation: $inc" "$admin/__ursula/raft/transfer?group=$g&to=$id" >/dev/null 2>&1 || true
  done <<<"$moves"
  sleep 0.2
done
echo "could not move every leadership to node $id" >&2
exit 1

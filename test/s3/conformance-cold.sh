#!/usr/bin/env bash
# Runs the official conformance suite against a one-node server whose cold tier flushes
# almost everything at once (1 KiB chunks every 5 ms, idle tails after 10 ms), so nearly
# every read spans both tiers. COLD_BACKEND=fs (default) or s3 (a versitygw started here
# on 127.0.0.1; run test/s3/install.sh first). COLD_ENGINE=memory (default) or raft (a
# single voter: every record_chunk goes through Raft).
# Usage: test/s3/conformance-cold.sh [vitest args]   (after make build conformance-deps)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
backend=${COLD_BACKEND:-fs}
engine=${COLD_ENGINE:-memory}
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
data=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$data"
}
trap cleanup EXIT
cat >"$data/ursula.toml" <<TOML
[server]
engine = "$engine"
[storage.cold]
backend = "$backend"
flush_interval = "5ms"
flush_size = "1KiB"
max_hot_size_per_group = "0"
flush_max_hot_age = "10ms"
gc_interval = "50ms"
gc_grace = "1s"
TOML
if [ "$backend" = s3 ]; then
  vgw=$(go env GOPATH)/bin/versitygw
  s3port=$(freeport)
  mkdir -p "$data/s3/ursula" "$data/s3meta"
  ROOT_ACCESS_KEY=conformance ROOT_SECRET_KEY=conformance-secret "$vgw" --port "127.0.0.1:$s3port" --quiet posix --sidecar "$data/s3meta" "$data/s3" >"$data/s3.log" 2>&1 &
  pids+=($!)
  cat >>"$data/ursula.toml" <<TOML
[storage.cold.s3]
bucket = "ursula"
endpoint = "http://127.0.0.1:$s3port"
access_key_id = "conformance"
secret_access_key = "conformance-secret"
server_side_encryption = "none"
TOML
  sleep 1
fi
port=$(freeport)
url="http://127.0.0.1:$port"
"$root/bin/ursula" server --config "$data/ursula.toml" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" >"$data/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -fsS "$url/__ursula/ready" >/dev/null 2>&1 && break; sleep 0.1; done
echo "== conformance with a $backend cold tier, $engine engine ($url)"
(cd test/conformance && CONFORMANCE_TEST_URL="$url" npx vitest run "$@")
echo "cold objects written: $(curl -fsS "$url/__ursula/metrics" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cold"]["cold_flushed_objects"])')"

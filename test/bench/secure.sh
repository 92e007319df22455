#!/usr/bin/env bash
# The cost of TLS and auth, side by side: a raft single voter (fsync=never) plain, against
# the same with TLS on the listener and a bearer token checked on every request
# (raft-secure), at 64 writers. The two alternate for SECURE_ROUNDS rounds (default 3),
# each round starting fresh servers, so a drift in the machine's load hits both alike; the
# report is the median of each and their ratio (secure / plain: throughput higher is
# better, p50 lower is better). Goal: throughput at most 15% lower (ratio >= 0.85).
# Usage: test/bench/secure.sh [ursula-bench flags, e.g. --duration 5s]
# Environment: SECURE_ROUNDS (3), BENCH_CLIENTS (raw), BENCH_OUT (results directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
rounds=${SECURE_ROUNDS:-3}
work=$(mktemp -d)
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() { stop_all; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

go build -o "$root/bin/ursula" ./cmd/ursula
go build -o "$root/bin/ursula-bench" ./cmd/ursula-bench
out=${BENCH_OUT:-$root/test/bench/results/secure-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
mkdir -p "$work/certs"
"$root/bin/ursula-bench" certs "$work/certs"
token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
printf '%s bench\n' "$token" >"$work/tokens"

run() { # run TARGET ROUND [bench flags]
  local target=$1 round=$2
  shift 2
  local port data url
  port=$("$root/bin/ursula-bench" freeport 1)
  data="$work/$target-$round"
  mkdir -p "$data"
  local secure=()
  if [ "$target" = raft-secure ]; then
    printf '[server]\ntls_cert_file = "%s"\ntls_key_file = "%s"\n[auth]\ntoken_file = "%s"\n' \
      "$work/certs/node.crt" "$work/certs/node.key" "$work/tokens" >"$data/ursula.toml"
    "$root/bin/ursula" server --config "$data/ursula.toml" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" >"$out/$target-$round-server.log" 2>&1 &
    pids+=($!)
    "$root/bin/ursula-bench" wait --ca-file "$work/certs/ca.crt" "https://127.0.0.1:$port/__ursula/ready"
    url="https://127.0.0.1:$port/bench"
    secure=(--ca-file "$work/certs/ca.crt" --token "$token")
  else
    "$root/bin/ursula" server --engine raft --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" >"$out/$target-$round-server.log" 2>&1 &
    pids+=($!)
    "$root/bin/ursula-bench" wait "http://127.0.0.1:$port/__ursula/ready"
    url="http://127.0.0.1:$port/bench"
  fi
  "$root/bin/ursula-bench" --url "$url" --label "$target" --scenarios append-64 --client "${BENCH_CLIENTS:-raw}" \
    --out "$out/$target-$round.json" ${secure[@]+"${secure[@]}"} "$@" >/dev/null
  stop_all
}

for r in $(seq 1 "$rounds"); do
  echo "== round $r/$rounds: raft, then raft-secure (append-64; $(nproc 2>/dev/null || echo ?) CPUs shared with the load generator)"
  run raft "$r" "$@"
  run raft-secure "$r" "$@"
done

python3 - "$out" "$rounds" <<'PY' | tee "$out/secure.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(target):
    res = []
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/{target}-{r}.json"))
        for x in d["results"]:
            if x["scenario"].startswith("append-64"):
                res.append(x)
    return res
plain, sec = rows("raft"), rows("raft-secure")
print(f"{'round':<6}{'raft ops/s':>14}{'secure ops/s':>14}{'raft p50 ms':>13}{'secure p50 ms':>15}{'errors':>8}")
for i, (p, s) in enumerate(zip(plain, sec), 1):
    print(f"{i:<6}{p['ops_per_sec']:>14.0f}{s['ops_per_sec']:>14.0f}{p['p50_ms']:>13.2f}{s['p50_ms']:>15.2f}{p['errors']+s['errors']:>8}")
mp, ms = statistics.median(x["ops_per_sec"] for x in plain), statistics.median(x["ops_per_sec"] for x in sec)
lp, ls = statistics.median(x["p50_ms"] for x in plain), statistics.median(x["p50_ms"] for x in sec)
ratio = ms / mp if mp else float("nan")
print(f"median  raft {mp:.0f} ops/s p50 {lp:.2f} ms | raft-secure {ms:.0f} ops/s p50 {ls:.2f} ms")
print(f"ratio secure/plain: throughput {ratio:.3f} ({abs(1-ratio)*100:.1f}% {'lower' if ratio < 1 else 'higher'}), p50 {ls/lp if lp else float('nan'):.3f}")
print("goal (throughput at most 15% lower):", "met" if ratio >= 0.85 else "NOT met")
PY
echo "results in $out"

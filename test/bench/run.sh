#!/usr/bin/env bash
# Side-by-side load benchmark: ursula on each engine against the Durable Streams reference
# server (@durable-streams/server, Node, pinned in test/conformance/package-lock.json).
#
# Builds bin/ursula and bin/ursula-bench, then for each target in turn starts it on free
# loopback ports, runs the same scenarios (append latency/throughput with 1, 16 and 64
# writers; SSE delivery latency to 100 live readers), and stops it, so targets never
# compete for the CPUs. This is done BENCH_ROUNDS times (default 3), the targets' rounds
# interleaved (round 1 of every target, then round 2, ...), and each figure is the median
# of its rounds (ursula-bench merge): a slow minute of the machine moves every target
# alike, and one odd round of a target (the reference server's figures vary most from run
# to run) moves nothing. The append scenarios run twice, with the lean raw client and with Go's
# net/http client (rows "append-N nethttp"). Then prints one comparison table (absolute
# numbers and the ratio of each target to the reference server, or of the first target to
# each other one when the reference is not run), and compares the run with the committed
# baseline test/bench/baseline.json: a line starting "REGRESSION:" for every figure more
# than 20% worse. Targets (BENCH_TARGETS, default all):
#   memory        ursula --engine memory (nothing persisted)
#   raft          ursula default: raft single voter, node log fsync=never
#   raft-secure   raft as above with TLS on the listener and a bearer token checked on
#                 every request (a throwaway CA and token made for the run), to compare
#                 with raft in the same run (test/bench/secure.sh alternates the two for
#                 3 rounds at 64 writers and reports the median ratio)
#   raft-always   raft single voter, node log fsync=always (every ack after fsync)
#   raft3         3-node loopback cluster (3 voters per group, fsync=never); every group's
#                 leadership is moved to node 1 and the bench talks to node 1
#   reference     the reference Node server
#
# Usage (from anywhere):  test/bench/run.sh [ursula-bench flags, e.g. --duration 10s]
# Environment:
#   BENCH_OUT      directory for the JSON results (default test/bench/results/<timestamp>)
#   BENCH_TARGETS  e.g. "memory raft raft3"
#   BENCH_ROUNDS   rounds per target, interleaved; figures are medians (default 3; 1 for a
#                  quick look)
#   URSULA_ARGS    extra flags for `ursula server`
#   BENCH_CLIENTS  clients of the append scenarios (default raw,nethttp)
#   BENCH_BASELINE the baseline file (default test/bench/baseline.json)
#   BENCH_WRITE_BASELINE=1  replace the baseline file with this run (refresh it from a full
#                  run on a quiet machine, and commit it)
#   BENCH_WARM_MB  MiB of tmpfs written and freed before the rounds, so that no target
#                  pays for the VM's first touch of guest memory (default 8192; 0: none)
#   BENCH_SCALE=1  also run the scale measurements on the default engine (a few more
#                  minutes; see the end of this script): 1 MiB appends (1 and 8 writers;
#                  default configuration, then cold tier off) against the disk's sequential
#                  write bandwidth (dd with one fdatasync, same directory, same run); with
#                  the cold tier off, SSE delivery to BENCH_SSE_LIVE (1000) live
#                  readers (measured first, on the node still quiet), and the time from
#                  kill -9 to ready with BENCH_RECOVERY_MB
#                  (1024) MiB in the journal; then, each on a fresh node: BENCH_STREAMS
#                  (100000) streams (memory per idle stream, kill -9 to ready with them) and
#                  BENCH_SSE_IDLE (10000) idle SSE readers (memory per reader)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
targets=${BENCH_TARGETS:-memory raft raft-secure raft-always raft3 reference}

work=$(mktemp -d)
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Cluster nodes are not our children (cluster.sh started them): wait for their exit.
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  pids=()
}
cleanup() { stop_all; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building"
go build -o "$root/bin/ursula" ./cmd/ursula
go build -o "$root/bin/ursula-bench" ./cmd/ursula-bench
if [[ " $targets " == *" reference "* ]] && [ ! -d test/conformance/node_modules/@durable-streams/server ]; then
  echo "== installing the reference server (npm ci in test/conformance)"
  (cd test/conformance && npm ci --no-audit --no-fund)
fi

out=${BENCH_OUT:-$root/test/bench/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

# The load generator runs in the background and is waited for, so that a signal to this
# script is handled at once (the trap stops the generator and the servers).
bench() {
  "$root/bin/ursula-bench" "$@" &
  local pid=$!
  pids+=("$pid")
  wait "$pid"
}

# Guest memory on these VMs is backed on first touch: a 4 KiB page written for the first
# time since boot cost 9-12 us against about 3 us for a page touched before (a 4 KiB
# pwrite into a new file, measured 2026-12-07). Every target gets new memory (the journal's
# and the cold tier's page cache, stream arenas, heap), so whichever target first reached
# untouched memory paid for it, and the order of the targets showed in their figures. So
# BENCH_WARM_MB (default 8192; 0 skips it) of tmpfs is written and freed once before the
# rounds, and each target's data is removed after its round, so the next target starts
# on memory touched before, as on a host that has been up for a while (the host takes
# freed memory back over a minute or two, so the removal matters most).
warm_memory() {
  local mb=${BENCH_WARM_MB:-8192} f=/dev/shm/ursula-bench-warm.$$
  [ "$mb" -gt 0 ] && [ -d /dev/shm ] || return 0
  local t0=$SECONDS
  head -c "${mb}M" /dev/zero >"$f" 2>/dev/null || true # a smaller tmpfs stops it early
  local got
  got=$(du -m "$f" | cut -f1)
  rm -f "$f"
  echo "== guest memory warmed: $got MiB of tmpfs written and freed in $((SECONDS - t0)) s"
}
warm_memory

results=()
rounds=${BENCH_ROUNDS:-3}
for round in $(seq 1 "$rounds"); do
for target in $targets; do
  port=$("$root/bin/ursula-bench" freeport 1)
  data="$work/$target.r$round"
  mkdir -p "$data"
  url="http://127.0.0.1:$port/bench"
  secure=()
  case $target in
    memory|raft)
      # shellcheck disable=SC2086
      "$root/bin/ursula" server --engine "$target" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" ${URSULA_ARGS:-} \
        >"$out/$target-server.r$round.log" 2>&1 &
      pids+=($!)
      "$root/bin/ursula-bench" wait "http://127.0.0.1:$port/__ursula/ready"
      ;;
    raft-secure)
      "$root/bin/ursula-bench" certs "$data"
      token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
      printf '%s bench\n' "$token" >"$data/tokens"
      printf '[server]\ntls_cert_file = "%s"\ntls_key_file = "%s"\n[auth]\ntoken_file = "%s"\n' \
        "$data/node.crt" "$data/node.key" "$data/tokens" >"$data/ursula.toml"
      # shellcheck disable=SC2086
      "$root/bin/ursula" server --config "$data/ursula.toml" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" ${URSULA_ARGS:-} \
        >"$out/$target-server.r$round.log" 2>&1 &
      pids+=($!)
      "$root/bin/ursula-bench" wait --ca-file "$data/ca.crt" "https://127.0.0.1:$port/__ursula/ready"
      url="https://127.0.0.1:$port/bench"
      secure=(--ca-file "$data/ca.crt" --token "$token")
      ;;
    raft-always)
      printf '[raft.wal]\nfsync = "always"\n' >"$data/ursula.toml"
      # shellcheck disable=SC2086
      "$root/bin/ursula" server --config "$data/ursula.toml" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$data" ${URSULA_ARGS:-} \
        >"$out/$target-server.r$round.log" 2>&1 &
      pids+=($!)
      "$root/bin/ursula-bench" wait "http://127.0.0.1:$port/__ursula/ready"
      ;;
    raft3)
      # Six fixed offsets from a random base; another process may hold one: retry elsewhere.
      for attempt in 1 2 3 4 5; do
        base=$(( $("$root/bin/ursula-bench" freeport 1) % 20000 + 30000 ))
        cdir="$data/attempt$attempt" # fresh: a node's raft state remembers its peers' addresses
        # The balancer off: lead.sh puts every leadership on node 1, the node the load goes to.
        URSULA_CLUSTER_RAFT="${URSULA_CLUSTER_RAFT:-}"$'\n''leader_balance_interval = "0"' URSULA_CLUSTER_BASE_PORT=$base URSULA_BIN="$root/bin/ursula" test/cluster/cluster.sh --background "$cdir" >/dev/null 2>"$data/cluster.err" && break
        [ $attempt = 5 ] && { cat "$data/cluster.err" >&2; exit 1; }
      done
      read -r -a cpids <"$cdir/pids"
      pids+=("${cpids[@]}")
      test/cluster/lead.sh 1 "http://127.0.0.1:$((base + 21))" "http://127.0.0.1:$((base + 22))" "http://127.0.0.1:$((base + 23))"
      url="http://127.0.0.1:$((base + 1))/bench"
      ;;
    reference)
      (cd test/conformance && exec node reference-server.mjs "$port") >"$out/reference-server.r$round.log" 2>&1 &
      pids+=($!)
      "$root/bin/ursula-bench" wait "http://127.0.0.1:$port/v1/stream/"
      url="http://127.0.0.1:$port/v1/stream"
      ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
  echo "== $target, round $round of $rounds ($(nproc 2>/dev/null || echo ?) CPUs, shared with the load generator)"
  bench --url "$url" --label "$target" --out "$out/$target.r$round.json" --client "${BENCH_CLIENTS:-raw,nethttp}" ${secure[@]+"${secure[@]}"} "$@"
  stop_all
  # Its data goes with it: the page cache it held is freed for the next target (see
  # warm_memory), and its dirty pages are dropped instead of written back during the next.
  rm -rf "$data"
done
done
for target in $targets; do
  rs=()
  for round in $(seq 1 "$rounds"); do rs+=("$out/$target.r$round.json"); done
  "$root/bin/ursula-bench" merge --out "$out/$target.json" "${rs[@]}"
  results+=("$out/$target.json")
done

echo "== comparison (each figure the median of $rounds rounds per target, the rounds interleaved)"
vs=()
[[ " $targets " == *" reference "* ]] && vs=(--vs reference)
"$root/bin/ursula-bench" compare "${vs[@]}" "${results[@]}" | tee "$out/compare.txt"
baseline=${BENCH_BASELINE:-$root/test/bench/baseline.json}
if [ "${BENCH_WRITE_BASELINE:-}" = 1 ]; then
  "$root/bin/ursula-bench" baseline --write --file "$baseline" "${results[@]}"
elif [ -f "$baseline" ]; then
  echo "== regression guard"
  "$root/bin/ursula-bench" baseline --file "$baseline" "${results[@]}" | tee "$out/baseline.txt"
else
  echo "== no baseline at $baseline (BENCH_WRITE_BASELINE=1 writes one)"
fi

if [ "${BENCH_SCALE:-}" = 1 ]; then
  echo "== scale (BENCH_SCALE=1, default engine: raft single voter, fsync never)"
  scale="$work/scale"
  mkdir -p "$scale"
  # Disk bandwidth as dd reports it: sequential 1 MiB writes, one fdatasync at the end.
  dd_mb=${BENCH_DD_MB:-512}
  dd_line=$(dd if=/dev/zero of="$scale/dd" bs=1M count="$dd_mb" conv=fdatasync 2>&1 | tail -1)
  rm -f "$scale/dd"
  disk_mbs=$(echo "$dd_line" | awk -F', ' '{split($1, b, " "); split($3, t, " "); printf "%.1f", b[1] / 1e6 / t[1]}')
  echo "disk: dd $dd_mb MiB with fdatasync: $disk_mbs MB/s ($dd_line)"
  # (the echo ends the line: read without a newline fails, and set -e stops the run)
  read -r port sport < <("$root/bin/ursula-bench" freeport 2 | tr '\n' ' '; echo)
  # A node with the cold tier off, for SSE, the 1 MiB runs without a cold tier and the
  # recovery: the SSE figure is the fan-out alone, and the recovery figure is the
  # journal's replay, not a flush.
  printf '[storage.cold]\nbackend = "none"\n' >"$scale/ursula.toml"
  start_scale() {
    # shellcheck disable=SC2086
    "$root/bin/ursula" server --config "$scale/ursula.toml" --engine raft --listen "127.0.0.1:$sport" --admin-listen 127.0.0.1:0 --data "$scale/data" ${URSULA_ARGS:-} \
      >>"$out/scale-server.log" 2>&1 &
    spid=$!
    pids+=("$spid")
  }
  start_scale
  "$root/bin/ursula-bench" wait --ok "http://127.0.0.1:$sport/__ursula/ready"
  surl="http://127.0.0.1:$sport/bench"
  # SSE first, on a quiet machine: after the 1 MiB runs the kernel frees and writes back
  # gigabytes for a while (a run of 2026-12-07 measured p99 232 ms right after them,
  # against 19-24 ms on a quiet node), and the delivery figure would measure that.
  live=${BENCH_SSE_LIVE:-1000}
  bench "$@" --url "$surl" --label raft-sse --scenarios "sse-$live" --client raw --out "$out/scale-sse.json" | tee "$scale/sse.txt"
  # 1 MiB appends, first on the default configuration (the fs cold tier under the data
  # directory: every byte goes to the journal and, flushed, to a chunk object), then with
  # the cold tier off (every byte stays hot, so the snapshots that keep the journal under
  # its budget carry all of it).
  "$root/bin/ursula" server --engine raft --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --data "$scale/default" ${URSULA_ARGS:-} \
    >>"$out/scale-server.log" 2>&1 &
  dpid=$!
  pids+=("$dpid")
  "$root/bin/ursula-bench" wait --ok "http://127.0.0.1:$port/__ursula/ready"
  bench "$@" --url "http://127.0.0.1:$port/bench" --label raft-1MiB --scenarios append-1,append-8 --body 1048576 --client raw --out "$out/scale-1mib.json" |
    tee "$scale/1mib.txt"
  kill "$dpid"
  wait "$dpid" 2>/dev/null || true
  rm -rf "$scale/default"
  # Let the kernel finish writing back what that run left dirty, so the runs that follow
  # do not share the disk with it.
  sync
  bench "$@" --url "$surl" --label raft-1MiB-cold-off --scenarios append-1,append-8 --body 1048576 --client raw --out "$out/scale-1mib-cold-off.json" |
    tee -a "$scale/1mib.txt"
  awk -v disk="$disk_mbs" '$2 ~ /^append-[0-9]+$/ && disk > 0 { printf "1 MiB appends, %s, %s: %s MB/s = %.0f%% of the disk (goal 50%%), %d refused\n", $1, $2, $6, 100 * $6 / disk, $NF }' "$scale/1mib.txt"
  awk '$2 ~ /^sse-/ { printf "SSE delivery to %s live readers: p99 %s (goal under 20 ms)\n", $3, $8 }' "$scale/sse.txt"
  # Fill the journal to BENCH_RECOVERY_MB with 1 MiB appends, kill -9, time until ready.
  want_mb=${BENCH_RECOVERY_MB:-1024}
  for _ in $(seq 1 200); do
    have_mb=$(du -sm "$scale/data" | awk '{print $1}')
    [ "$have_mb" -ge "$want_mb" ] && break
    "$root/bin/ursula-bench" --url "$surl" --label fill --scenarios append-8 --body 1048576 --client raw --duration 2s --warmup 0s >/dev/null
  done
  have_mb=$(du -sm "$scale/data" | awk '{print $1}')
  kill -9 "$spid"
  wait "$spid" 2>/dev/null || true
  t0=$(date +%s.%N)
  start_scale
  "$root/bin/ursula-bench" wait --ok --timeout 300s "http://127.0.0.1:$sport/__ursula/ready"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v mb="$have_mb" 'BEGIN { printf "recovery: kill -9 with %d MiB in the data directory, ready again in %.2f s = %.2f s per GiB (goal under 5 s for 1 GB)\n", mb, b - a, (b - a) * 1024 / mb }'
  stop_all

  # Many streams, many idle readers: each on a fresh node of its own (same engine and
  # config), its memory read from the metrics of its admin listener after a collection.
  # (the echo ends the line: read without a newline fails, and set -e stopped the run here)
  read -r many_port many_admin < <("$root/bin/ursula-bench" freeport 2 | tr '\n' ' '; echo)
  start_many() { # $1: data directory
    # shellcheck disable=SC2086
    "$root/bin/ursula" server --config "$scale/ursula.toml" --engine raft --listen "127.0.0.1:$many_port" --admin-listen "127.0.0.1:$many_admin" --data "$1" ${URSULA_ARGS:-} \
      >>"$out/scale-many-server.log" 2>&1 &
    mpid=$!
    pids+=("$mpid")
    "$root/bin/ursula-bench" wait --ok --timeout 300s "http://127.0.0.1:$many_port/__ursula/ready"
  }
  many_url="http://127.0.0.1:$many_port/bench"
  many_metrics="http://127.0.0.1:$many_admin/__ursula/metrics"
  # BENCH_STREAMS (100000) streams, each created by a PUT with a 64-byte first append;
  # memory per idle stream; then kill -9 and the time until ready again with them all.
  nstreams=${BENCH_STREAMS:-100000}
  start_many "$scale/many"
  "$root/bin/ursula-bench" streams --url "$many_url" --streams "$nstreams" --metrics "$many_metrics" | tee "$scale/streams.txt"
  kill -9 "$mpid"
  wait "$mpid" 2>/dev/null || true
  t0=$(date +%s.%N)
  start_many "$scale/many"
  t1=$(date +%s.%N)
  "$root/bin/ursula-bench" memory --metrics "$many_metrics" >"$scale/streams-restarted.txt"
  awk -v a="$t0" -v b="$t1" -F'[ =]' '
    FILENAME ~ /restarted/ { for (i = 1; i < NF; i++) if ($i == "rss") rss_after = $(i + 1); next }
    /^streams=/ { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1) }
    END {
      printf "%d streams: %d B per idle stream (RSS), %d B heap; restart %.2f s (kill -9 to ready; RSS after the restart %d B per stream)\n",
        v["streams"], v["rss_per_stream"], v["heap_per_stream"], b - a, (rss_after - v["rss_before"]) / v["streams"]
    }' "$scale/streams.txt" "$scale/streams-restarted.txt"
  stop_all
  # BENCH_SSE_IDLE (10000) idle SSE readers over 100 streams: the node's memory per reader.
  nidle=${BENCH_SSE_IDLE:-10000}
  start_many "$scale/idle"
  "$root/bin/ursula-bench" sse-idle --url "$many_url" --readers "$nidle" --metrics "$many_metrics" | tee "$scale/idle.txt"
  awk -F'[ =]' '/^readers=/ { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1)
      printf "%d idle SSE readers: %d B per reader (RSS), %d B heap (goal under 16 KiB: %s)\n",
        v["readers"], v["rss_per_reader"], v["heap_per_reader"], (v["rss_per_reader"] < 16384 ? "met" : "NOT MET") }' "$scale/idle.txt"
  stop_all
fi
echo "results in $out"
